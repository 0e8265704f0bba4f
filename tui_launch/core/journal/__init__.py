"""The JSONL journal: the writer, its text, the timeline a replay walks."""
