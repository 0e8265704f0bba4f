"""The pure model of a run: events in, snapshots out, and what is said about them.

No threads of its own and nothing of torch: the live run, the front ends and a replayed journal
all build on it, so it sits at the bottom of the core (beside ``workers``).

- ``events``: the frozen event records, by family (``run``, ``telemetry``, ``diagnosis``),
  and the registry that reads journal lines back.
- ``store``: :class:`~tui_launch.core.model.store.RunStore` and the pure ``reduce``
  (snapshot, event) -> snapshot, which dispatches each event to its reducer.
- ``snapshot``: the ``Snapshot`` (the run's state at one version, plain frozen data), the
  views it is made of, and its ``Phase`` words.
- ``reducers``: how each event changes the snapshot: one reducer per event type
  (``@reduces``), by event family.
- ``history``: ``History``, the append-only sequence the snapshot's lists of events are:
  each event appends in O(1), every earlier snapshot keeps its view.
- ``telemetry``: the store's telemetry view: latest sample, short histories, per-rank totals.
- ``progress``: the store's progress view: latest sample, rate histories, per-attempt facts.
- ``goodput``: goodput across attempts, as pure functions.
- ``commands``: commands as data: the command types, ``allowed(snapshot, cmd)``, their JSON.
- ``errors``: explaining failures: signal names and hints, error files, the stderr tail.
- ``diskspace``: a full file system, in words.
- ``failclass``: what kind of failure a rank's end was (startup, exception, crash, oom, ...),
  from the evidence alone.
- ``policy``: the restart policy: restart or stop after a failed attempt, and why.
- ``exitcodes``: the exit-code table (``--exit-codes``): an outcome as the exit status a
  scheduler can act on.
- ``text``: plain-text renderings of events and failures (headless output, journal readers).
- ``redact``: secrets replaced, by name and by value shape (every output of a run).
"""
