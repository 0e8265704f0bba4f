"""tuilaunch: torchrun with a cockpit.

The same elastic launch as torchrun (torch's own parser and agent), plus a live dashboard,
root causes with tracebacks, lossless per-rank logs, restarts that work, and a control API
to kill, stop, continue or restart workers. ``tui_launch.core`` holds everything that is not
a user interface and imports neither Textual nor rich.
"""

__version__ = "0.1.0"
