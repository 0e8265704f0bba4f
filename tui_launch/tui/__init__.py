"""The Textual dashboard: panels rendered from store snapshots, keys sent to the runner."""
