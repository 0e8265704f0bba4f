"""The dashboard's sources: a live run, a replayed journal, an attached run."""
