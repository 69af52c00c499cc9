"""Where effects happen: a reclaim plan applied (`applier`) and recorded (`journal`), for the
reaper's scan and the console's move alike."""
