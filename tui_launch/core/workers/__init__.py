"""The worker processes: what tuilaunch knows of them and does to them, below torch's agent.

- ``table``: :class:`~tui_launch.core.workers.table.RankTable`, the one owner of this node's
  rank state (pids, exits, stopped ranks, marks), with its own lock.
- ``shim``: the worker bootstrap (on unless ``--no-bootstrap``): runs the program as python
  would, starts the responder, takes ``exit``/``exception`` injections and the faulthandler
  dump, and marks when ``main`` returned.
- ``responder``: the Flight Recorder's thread in each worker: answers the launcher with the
  rank's Flight Recorder and every thread's stack (torch's private API, in ``PRIVATE_NAMES``).
- ``warm``: ``--warm-start``'s pool: the node's spare interpreter and the workers forked from it.
- ``spare``: the spare interpreter itself (a process of its own).
- ``env``: the environment each worker really runs with, for the telemetry and the fake NVML.
- ``reaper``: no orphans: the run's containment (cgroup v2 with ``cgroup.kill``, else a
  subreaper and a sweep by run token) and the reaper process that sweeps if the launcher dies.
- ``stale``: the run cgroups of launchers that died with their reaper, emptied and removed.
- ``oom``: was it the kernel's OOM killer: the memory cgroup's count, else the kernel log.
"""
