"""Worker and launcher logs: every line to a file, read by byte offset, bounded in memory.

Log lines bypass the store: a rank printing a flood of lines must not flood the event history.

- ``tail``: :class:`~tui_launch.core.logs.tail.LogTailer` (the ``tuilaunch-logs`` thread) and
  the sink types: whole lines, raw byte ranges, each stream's unterminated text.
- ``sinks``: the dashboard's bounded ``LogBuffer``, the duplicate filters, the agent log capture.
- ``console``: worker output to a console byte for byte as torchrun writes it.
- ``lastlines``: a log file's last lines as a terminal last showed them (for reports).
- ``stderr``: the launcher's own fd 2 (torch's C++ output) into the agent log, in short on the
  console (the ``tuilaunch-stderr`` thread).
"""
