"""The torch seam: the launcher's modules that use torch's private API.

Each lists the private names it uses in ``PRIVATE_NAMES``; ``tests/test_torch_seam.py`` checks
every one against the installed torch, so an upgrade that renames one fails there, by name. The
one other user of torch's private API runs inside the workers, not the launcher:
:mod:`tui_launch.core.workers.responder`, checked the same way.

- ``names``: :class:`~tui_launch.core.seam.names.TorchName`, how a private name is recorded.
- ``agent``: torch's ``run`` with an observing ``LocalElasticAgent`` subclass, the worker
  bootstrap and warm-start handlers, typed shapes and accessors of torch's worker group.
- ``rendezvous``: a rendezvous handler's cached state without touching the network, the
  ``tuilaunch-sampler`` thread, who hosts the c10d store.
- ``logspecs``: a ``LogsSpecs`` subclass that sends every stream to a file.
- ``flightrec``: the variables that arm (by default) the Flight Recorder in the
  workers (the responder that reads it is ``core.workers.responder``).
"""
