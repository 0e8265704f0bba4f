"""How each event changes the snapshot: one reducer per event type, by event family.

The modules follow :mod:`tui_launch.core.model.events` (``run``, ``telemetry``, ``diagnosis``);
``base`` holds the registry. Importing this package registers every reducer, so
:func:`reducer_for` finds them; :func:`~tui_launch.core.model.store.reduce` dispatches to it.
"""

from __future__ import annotations

from tui_launch.core.model.reducers import diagnosis, run, telemetry
from tui_launch.core.model.reducers.base import REDUCERS, Reducer, reducer_for, reduces

__all__ = ["REDUCERS", "Reducer", "diagnosis", "reducer_for", "reduces", "run", "telemetry"]
