"""Stand-ins for what cannot exist on every machine (a GPU), shipped for tests and ``--demo``."""
