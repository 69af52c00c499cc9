"""Pure decisions: who owns a consumer, who is down, what to reclaim. No I/O, no clock."""
