"""The Textual dashboard: panels rendered from snapshots, commands sent through a source.

- ``app``: the dashboard app: layout, refresh loop, the view's keys.
- ``commands``: the dashboard's keys that act on the run: each builds a command and sends it.
- ``actions``: every key, declared once (bindings, help, palette, when each applies).
- ``mode``: the base of the modes (the live run's own mode).
- ``modes``: what replay, attach and attach --control add to the dashboard (the cursor's bar
  and keys, following the journal).
- ``run``: running the dashboard in a real terminal: fd 2 into the agent log meanwhile.
- ``sources``: what the dashboard reads and sends commands to.
- ``panels``: pure renderers, snapshot to rich renderable.
- ``widgets``: the dashboard's widgets and modal screens.
"""
