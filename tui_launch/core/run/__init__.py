"""A run: the runner and its parts, options, control, faults, failures."""
