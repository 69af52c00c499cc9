"""Operator commands over the HTTP API: `work`, `pending`, `move`, `deadletters`, `reclaims`."""
