"""The subcommands: one module each, each with ``main(argv) -> int`` (``cli`` only dispatches).

- ``launch``: ``tuilaunch [torchrun options] script ...``: parse, validate, pick a front end
  (dashboard, ``--no-tui``, ``--detach``), signals, the exporters, the exit status.
- ``ls``: ``tuilaunch ls``: this user's live and recent runs, from the run index.
- ``replay``: ``tuilaunch replay RUN_DIR|journal``: the dashboard over a recorded run.
- ``attach``: ``tuilaunch attach [RUN] [--control]``: the dashboard following a running job,
  read-only or, with ``--control``, acting on it over its control socket.
- ``report``: ``tuilaunch report RUN_DIR|journal``: a run as one self-contained HTML page
  or Markdown.
- ``status``: ``tuilaunch status [RUN] [--json]``: a run's state, a versioned JSON document.
- ``ctl``: ``tuilaunch ctl RUN VERB``: the control socket's commands from a script.
- ``mcp``: ``tuilaunch mcp [--control]``: an MCP server (stdio) for coding agents.
- ``serve``: ``tuilaunch serve [RUN]``: the dashboard in a browser (textual-serve, a token).
- ``why``: ``tuilaunch why [PATH] [--json]``: Flight Recorder dumps from anywhere (a run, a
  directory, a file), read as plain data and judged: which rank the others wait on.
"""
