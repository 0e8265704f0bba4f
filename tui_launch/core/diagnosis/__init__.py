"""Watching ranks without changing them: stack dumps, verdicts, hangs, stragglers.

- ``stacks``: the stack dumps themselves (py-spy, faulthandler), their model, the verdict,
  the run directory's copies, and hang detection as a pure state machine.
- ``dumps``: :class:`~tui_launch.core.diagnosis.dumps.Dumper`: one owner of a dump, from the
  request to the run directory and the ``StacksDumped`` event.
- ``rhythm``: the adaptive hang rule (``--hang-timeout auto``): how long a job may stand still,
  from its own step intervals (or its output before it has a rhythm).
- ``hangwatch``: the hang watch (``tuilaunch-hang``): the rule, two dumps that match,
  ``--on-hang``.
- ``straggler``: the straggler sampler (``tuilaunch-stragglers``): low-rate stack samples.
- ``records``: every rank's Flight Recorder and stacks, asked of its responder
  (``--flight-recorder``).
- ``collectives``: the live poll of the responders (``tuilaunch-collectives``).
"""
