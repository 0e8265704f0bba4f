"""One run: torch's torchrun path on a thread, observed, steered, and wound down.

- ``runner``: the runner: creates the parts, each from parts built before it (no late
  binding), sequences the run's start and end, and is the live run handle (each call
  forwarded to the part that owns it).
- ``config``: tuilaunch's settings for one run, built once from the command line (frozen;
  the command line itself is :mod:`tui_launch.core.launch`).
- ``state``: the run's shared state under one lock: phase, stop and restart requests, outcome.
- ``wake``: the agent thread's idle wait between monitor ticks, woken by a worker's exit (its
  pidfd) or a request.
- ``observer``: the agent's observer: what happens at each of the agent's transitions;
  ``monitor``, the one decision point.
- ``watchers``: the watchers of a run that has not crashed (dumps, hang watch, progress,
  stragglers), wired to the log tailer and the store.
- ``handle``: the run handle, the one surface the front ends use.
- ``control``: where a live run executes a command (:mod:`tui_launch.core.model.commands`):
  the actions on the ranks and the run, and the command front that asks ``allowed``.
- ``inject``: the ``--inject`` spec language and the scheduler that fires it.
- ``faults``: what a fired injection does to a rank.
- ``failures``: an attempt's failed ranks, from what torch and the rank table say.
- ``membership``: rendezvous rounds, lost nodes, the cluster view's wiring.
- ``shutdown``: stopping a run, and the watchdog for when torch cannot be reached.
- ``rundir``: the run directory and the log wiring.
- ``reports``: torch's objects as events.
"""
