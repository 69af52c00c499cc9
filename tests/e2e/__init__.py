"""End-to-end tier: a real conductor process and real `rig-conductor agent` processes."""
