"""Route modules, one router each."""
