"""The pure model of a run: events in, snapshots out, and what is said about them.

No threads of its own and nothing of torch: the live run, the front ends and a replayed journal
all build on it, so it sits at the bottom of the core (beside ``workers``).

- ``events``: the frozen event records, by family (``run``, ``telemetry``, ``diagnosis``),
  the registry that reads journal lines back, and ``EventTable``: the one way to dispatch on
  an event's type (reducers, describers, marks, ...).
- ``store``: :class:`~tui_launch.core.model.store.RunStore` and the pure ``reduce``
  (snapshot, event) -> snapshot, which dispatches each event to its reducer.
- ``snapshot``: the ``Snapshot`` (the run's state at one version, plain frozen data), the
  views it is made of, and its ``Phase`` and ``RankState`` words.
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
- ``text``: plain-text renderings of events and failures (headless output, journal readers):
  an event type's line, registered with ``@describes``, or silent (``SILENT``).
- ``redact``: secrets replaced, by name and by value shape (every output of a run).
- ``failclass``: a failure's class (``FailureClass``) from its evidence.
- ``policy``: the restart policy (``Policy``, a rule per failure class): restart or stop.
- ``exitcodes``: the exit-code table (``ExitStyle``, a code per failure class).
- ``words``: ``Word``, the ``(str, Enum)`` every vocabulary is: a member is its string.
- ``layout``: the run directory's layout: every file's path (``RunDirLayout``), said once.
"""
