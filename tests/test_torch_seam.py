"""Every private torch name the seam uses still exists in the installed torch.

The seam modules (core/seam/agent.py, rendezvous.py, logspecs.py) and the worker-side responder
(core/workers/responder.py) each list the private names they rely on in ``PRIVATE_NAMES``; a
torch upgrade that renames one fails here, with the name, instead of somewhere deep in a launch.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from tui_launch.core.seam import agent, logspecs, rendezvous
from tui_launch.core.seam.names import SEAM_MODULES, TorchName
from tui_launch.core.workers import responder

# The responder sits below the seam and lists its names as plain tuples in TorchName's order.
RESPONDER_NAMES = tuple(TorchName(*n) for n in responder.PRIVATE_NAMES)
NAMES = (
    *agent.PRIVATE_NAMES,
    *rendezvous.PRIVATE_NAMES,
    *logspecs.PRIVATE_NAMES,
    *RESPONDER_NAMES,
)


def test_every_seam_module_is_checked() -> None:
    assert tuple(m.__name__ for m in (agent, rendezvous, logspecs, responder)) == SEAM_MODULES


def _source(module: str) -> str:
    # Read, not imported: the etcd modules import python-etcd, which need not be installed.
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"torch has no module {module}"
    with open(spec.origin, encoding="utf-8") as fp:
        return fp.read()


def _present(n: TorchName) -> bool:
    if n.kind == "attr":
        obj: object = importlib.import_module(n.module)
        if n.owner is not None:
            obj = getattr(obj, n.owner)
        return hasattr(obj, n.name)
    text = _source(n.module)
    if n.owner is not None and f"class {n.owner}" not in text:
        return False
    if n.kind == "instance":
        return f"self.{n.name}" in text
    if n.kind == "text":
        return n.name in text
    raise AssertionError(f"unknown kind {n.kind!r}")


@pytest.mark.parametrize("name", NAMES, ids=lambda n: f"{n.owner or n.module}.{n.name}"[:80])
def test_private_name_exists(name: TorchName) -> None:
    assert _present(name), f"torch changed: {name} is gone"


def test_the_list_covers_every_seam_module() -> None:
    assert set(NAMES) == {
        *agent.PRIVATE_NAMES,
        *rendezvous.PRIVATE_NAMES,
        *logspecs.PRIVATE_NAMES,
        *RESPONDER_NAMES,
    }
    names = {n.name for n in NAMES}
    # The hooks the observing agent overrides, and the attributes it reads and writes.
    assert set(agent.HOOKS) <= names
    assert {"_remaining_restarts", "_worker_group", "_pcontext", "_state_holder"} <= names
    assert {"subprocess_handlers", "_pc", "_settings", "_this_node", "_rdzv_impl"} <= names


def test_a_missing_name_is_caught() -> None:
    """The check is not vacuous: made-up names are reported missing, for every kind."""
    mod = "torch.distributed.elastic.agent.server.api"
    assert not _present(TorchName(mod, "SimpleElasticAgent", "_no_such_hook"))
    assert not _present(TorchName(mod, "SimpleElasticAgent", "_no_such_attr", "instance"))
    assert not _present(TorchName(mod, "NoSuchClass", "_worker_group", "instance"))
    assert not _present(TorchName(mod, None, "no such log message", "text"))


def test_the_observing_agent_overrides_exactly_the_hooks() -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    cls = agent.make_agent_class(object(), LocalElasticAgent)  # type: ignore[arg-type]
    overridden = {k for k in vars(cls) if callable(vars(cls)[k]) and not k.startswith("__")}
    assert overridden == set(agent.HOOKS)
    assert issubclass(cls, LocalElasticAgent)
