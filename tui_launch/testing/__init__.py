"""Stand-ins for tests, scripts and bench (and ``--demo``'s fake GPUs), never for the product.

The ``testing`` contract in ``pyproject.toml`` keeps every other package from importing this
one; the fake NVML the product itself uses lives in :mod:`tui_launch.core.telemetry.fake_nvml`.

- ``builders``: small builders of the events a run is made of.
- ``frgen``: synthetic Flight Recorder dump sets of a Megatron-style job (culprits that hang
  or stall, a mismatch, a missing dump), for tests and ``bench/frgen.py``.
- ``fake_source``: ``FakeSource``, a deterministic ``Source`` for pilot and snapshot tests.
- ``scenarios``: the deterministic runs the dashboard is tested and pictured in.
- ``scale``: emulated nodes' synthetic ranks and counted store clients (``bench/scale.py``).
- ``procs``: a launch's processes found by the token in their environment, their CPU and memory.
"""
