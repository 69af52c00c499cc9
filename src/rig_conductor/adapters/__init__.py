"""Thin I/O adapters: they fetch and apply, returning domain objects; they decide nothing."""
