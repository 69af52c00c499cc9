"""rig-conductor: reclaims Redis Streams work stuck in the pending lists of dead consumers."""

__version__ = "0.2.0"
