"""The reaper: one scan (`cycle.reap_once`) and what runs it."""
