"""Route modules: a router each, except events.py, which adds its one route to the app."""
