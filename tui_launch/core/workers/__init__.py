"""The worker processes: the rank table, the bootstrap, warm starts, the reaper."""
