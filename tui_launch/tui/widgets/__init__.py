"""The dashboard's widgets and modal screens, each cheap to update.

- ``cached``: ``CachedPanel`` (redraws only when its key changes) and the footer.
- ``table``: the workers table, one row per local rank.
- ``tabs``: the tab bar, one widget.
- ``logpane``: the Logs tab: one rank or all, its filter and follow mode.
- ``logview``: the log widget itself, cheap to append to.
- ``screens``: the y/n confirmation, the help screen, the inject menu.
"""
