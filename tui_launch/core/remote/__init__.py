"""Reaching a run from outside its process.

- ``controlsock``: the control socket (``--control-socket``, ``--detach``, ``D``): commands
  as data from ``attach --control``, checked by ``SO_PEERCRED``.
- ``runindex``: the per-user index of runs in ``$XDG_RUNTIME_DIR/tuilaunch/``, read by ``ls``
  and ``attach``, with the sweep of stale entries.
- ``status``: what ``RUN`` names (a run id, a pid, a run directory, a journal), and a run's
  state as the versioned ``status --json`` document.
- ``detach``: running without a terminal: ``D`` in the dashboard and ``--detach``.
"""
