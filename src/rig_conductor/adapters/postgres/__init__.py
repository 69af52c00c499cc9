"""PostgreSQL storage: heartbeats, the event log, schema migrations."""
