"""The JSONL journal: how a run is recorded, and read back for replay and attach.

- ``writer``: :class:`~tui_launch.core.journal.writer.Journal`: every journaled event as one
  JSON line, kept in memory until the run directory exists; a full disk never raises.
- ``timeline``: a journal as a timeline: the snapshot and the logs' extent at any event,
  from an index and checkpoints computed in the background.
- ``text``: the journal's text read without JSON: line prefixes, parsed blocks, log-mark folds.
- ``steps``: a replayed rank's step as its log at the cursor shows it, not the journal's
  last progress record.
- ``recent``: an attach's first frame: the state at the journal's end without its old
  telemetry records.
- ``report``: a journal and its run directory as the model ``tuilaunch report`` renders: the
  final snapshot, the events on a time axis, the records as plot series, log tails, stacks.
- ``marks``: the events the report puts on its time axis, and their words: a mark maker per
  event type (``@marks``).
"""
