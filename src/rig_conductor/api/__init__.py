"""The HTTP API: FastAPI app, event intake, read views, health."""
