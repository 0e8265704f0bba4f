"""tuilaunch: torchrun with a cockpit.

The same elastic launch as torchrun (torch's own parser and agent), plus a live dashboard,
root causes with tracebacks, lossless per-rank logs, restarts that work, and a control API
to kill, stop, continue or restart workers.

- ``cli``: the ``tuilaunch`` command: argv to a subcommand's ``main(argv) -> int``, the exit.
- ``__main__``: ``python -m tui_launch``, the same command.
- ``apps``: one module per subcommand, each a whole program (launch, ls, replay, ...).
- ``tui``: the Textual dashboard.
- ``headless``: ``--no-tui``: event lines, the workers' output, a status line, the summary.
- ``metrics``: Prometheus metrics of a run (``--metrics-port``, ``--metrics-textfile``).
- ``report``: ``tuilaunch report``'s renderers, HTML and Markdown.
- ``summary``: the end-of-run summary both front ends print (rich).
- ``core``: everything that is not a user interface; it imports neither Textual nor rich.
- ``testing``: stand-ins for tests, scripts and bench, never imported by the product.
- ``examples``: the programs that ship with tuilaunch (``--demo``'s trainer).

docs/ARCHITECTURE.md is the map: the layers, the packages, the threads, where to add what.
"""

__version__ = "0.1.0"
