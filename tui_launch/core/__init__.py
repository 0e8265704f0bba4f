"""The launcher's core: everything that is not a user interface (no Textual, no rich).

A test imports every module of this package in a fresh interpreter and checks that neither
Textual nor rich was loaded, so the headless mode, the journal and other tools can use it
without a UI stack. Its packages, lowest first (``pyproject.toml``'s ``layers`` contract):

- ``periodic``: :class:`~tui_launch.core.periodic.Periodic`, the one background loop.
- ``fswatch``: :class:`~tui_launch.core.fswatch.FsWatch`, a loop woken by writes (inotify).
- ``model``: the pure model: events, the store and its views, commands, errors, text.
- ``workers``: the worker processes: rank table, bootstrap, warm spare, reaper, environment.
- ``progress``: progress read from the logs (parsers, trackers, the watcher).
- ``telemetry``: GPU and process samplers, rank-to-GPU mapping, the fake NVML.
- ``logs``: the log tailer, its sinks, the console copy, the launcher's own fd 2.
- ``diagnosis``: stack dumps, verdicts, the hang watch, the straggler sampler.
- ``seam``: the launcher's uses of torch's private API, each name listed in ``PRIVATE_NAMES``
  (the worker-side responder, ``workers.responder``, lists its own).
- ``journal``: the JSONL journal: writer, timeline for replay, an attach's first frame.
- ``job``: the job across nodes: the cluster view and job-wide dumps.
- ``launch``: the command line: tuilaunch's options declared once, torchrun's parser, the
  checks before anything starts, Slurm, ``--demo``.
- ``run``: one run: the runner, its configuration, control, faults, failures, the run handle.
- ``remote``: reaching a run from outside: control socket, run index, detach.

docs/ARCHITECTURE.md explains the layers, the threads and where to add what.
"""
