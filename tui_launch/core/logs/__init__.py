"""Worker and launcher logs: the tailer, its sinks, the console, the stderr pipe."""
