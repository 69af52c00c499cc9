"""Kept for bench/audit.py, which imports these names from here; they live in harness.py."""

from harness import BenchError, conninfo, ensure_database

__all__ = ["BenchError", "conninfo", "ensure_database"]
