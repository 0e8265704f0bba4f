"""How the torch seam names the private torch API it relies on.

Three modules of the seam (:mod:`.agent`, :mod:`.rendezvous`, :mod:`.logspecs`) and the
Flight Recorder's responder, which runs inside the workers and so lives in
:mod:`tui_launch.core.workers.responder`, use torch's private API; each lists its private names
in ``PRIVATE_NAMES`` (the seam's as :class:`TorchName` records, the responder's as plain tuples
in the same order, since it sits below the seam), and ``tests/test_torch_seam.py`` checks every
one against the installed torch. This module holds only the record type, so that the seam's
modules can share it without importing each other.
"""

from __future__ import annotations

from typing import NamedTuple

# The modules that use torch's private API, each with a PRIVATE_NAMES tuple.
SEAM_MODULES = (
    "tui_launch.core.seam.agent",
    "tui_launch.core.seam.rendezvous",
    "tui_launch.core.seam.logspecs",
    "tui_launch.core.workers.responder",
)


class TorchName(NamedTuple):
    """One private torch name the seam relies on, and how to check that it still exists.

    ``kind``: ``attr``, ``getattr(module[.owner], name)`` exists; ``instance``, an attribute
    that torch sets in ``__init__`` (``self.<name>`` appears in the module's source, read
    without importing it); ``text``, ``name`` appears verbatim in the module's source (a log
    message that is filtered).
    """

    module: str
    owner: str | None
    name: str
    kind: str = "attr"
