"""The one list of places a rank waits for its peers, checked against torch's own modules.

Every entry must still exist in the installed torch, and every public function of
``torch.distributed.distributed_c10d`` and of the functional collectives must be either listed
or named here as no wait: a torch upgrade that adds a collective, or renames DDP's buffer
broadcast, fails here by name instead of turning into a verdict that names the waiting rank.
"""

from __future__ import annotations

import importlib
import inspect
import warnings

import pytest

from tui_launch.core.diagnosis.stacks import (
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
    collective_of,
    verdict,
)
from tui_launch.core.diagnosis.stacks.model import Frame
from tui_launch.core.diagnosis.stacks.waits import WAITS, Wait, wait_at

# Public functions of distributed_c10d that never wait for another rank.
C10D_NO_WAIT = {
    "destroy_process_group",  # local: frees this rank's groups
    "get_backend",
    "get_backend_config",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
    "record_comm",  # a context manager naming the collectives inside it
    "supports_complex",
}
# The functional collectives' helpers that issue nothing.
FC_NO_WAIT_SUFFIX = ("_setup_context",)
FC_NO_WAIT = {"allow_inflight_collective_as_graph_input_ctx"}
DDP = "torch.nn.parallel.distributed"


def _resolve(w: Wait) -> object:
    obj: object = importlib.import_module(w.module)
    for part in w.name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("w", WAITS, ids=lambda w: f"{w.module}.{w.name}")
def test_every_listed_wait_exists_in_torch(w: Wait) -> None:
    obj = _resolve(w)
    assert callable(obj), f"torch changed: {w.module}.{w.name} is not a function"
    # The frame a waiting rank shows is in the listed file (where the function is defined).
    code = getattr(inspect.unwrap(obj), "__code__", None)
    if code is not None:
        assert code.co_filename.endswith("/" + w.file), (code.co_filename, w.file)
        assert code.co_name == w.bare


def _public_functions(module: str) -> set[str]:
    m = importlib.import_module(module)
    names = getattr(m, "__all__", None) or [n for n in vars(m) if not n.startswith("_")]
    out = set()
    for n in names:
        with warnings.catch_warnings():  # reduce_op's deprecation warning
            warnings.simplefilter("ignore", FutureWarning)
            obj = getattr(m, n)
            if inspect.isfunction(obj) and getattr(obj, "__module__", "") == m.__name__:
                out.add(n)
    return out


def _listed(module: str) -> set[str]:
    return {w.name for w in WAITS if w.module == module}


def test_every_public_c10d_function_is_a_listed_wait_or_named_as_none() -> None:
    public = _public_functions("torch.distributed.distributed_c10d")
    assert {"all_reduce", "barrier", "broadcast_object_list", "send"} <= public
    unclassified = public - _listed("torch.distributed.distributed_c10d") - C10D_NO_WAIT
    assert not unclassified, f"new in torch: is each a wait? {sorted(unclassified)}"
    assert not (C10D_NO_WAIT & _listed("torch.distributed.distributed_c10d"))


def test_every_functional_collective_is_a_listed_wait() -> None:
    module = "torch.distributed._functional_collectives"
    public = {
        n
        for n in _public_functions(module)
        if not n.endswith(FC_NO_WAIT_SUFFIX) and n not in FC_NO_WAIT
    }
    assert {"all_reduce", "wait_tensor", "reduce_scatter_tensor"} <= public
    missing = public - _listed(module)
    assert not missing, f"new in torch: is each a wait? {sorted(missing)}"


def test_ddp_and_fsdp_entries_are_listed() -> None:
    # The framework code that calls a native collective (no c10d frame under it).
    import torch.distributed.fsdp  # noqa: F401  (FSDP1 and FSDP2 both load)

    names = {(w.module, w.name) for w in WAITS}
    for need in (
        (DDP, "DistributedDataParallel._sync_buffers"),
        (DDP, "DistributedDataParallel._distributed_broadcast_coalesced"),
        ("torch.distributed.utils", "_sync_module_states"),
        ("torch.distributed.fsdp._fully_shard._fsdp_collectives", "foreach_all_gather"),
        ("torch.distributed.fsdp._fully_shard._fsdp_collectives", "foreach_reduce"),
        ("torch.distributed.fsdp._flat_param", "FlatParamHandle._all_gather_flat_param"),
        ("torch.distributed.fsdp._runtime_utils", "_reduce_grad"),
        ("torch.distributed.distributed_c10d", "Work.wait"),
    ):
        assert need in names, need


# --------------------------------------------------------------------------- frames


def _torch_frame(w_module: str, qualname: str, line: int = 1) -> Frame:
    file = w_module.replace(".", "/") + ".py"
    return Frame(qualname, file, line, f"/venv/lib/python3.11/site-packages/{file}")


def _user(function: str, line: int) -> Frame:
    return Frame(function, "nlp_example.py", line, "/work/nlp_example.py")


# What py-spy showed of rank 0 of accelerate's nlp_example while rank 1 slept: the forward's
# buffer broadcast, whose innermost Python frame calls the native dist._broadcast_coalesced.
BUFFERS = (
    _torch_frame(DDP, "DistributedDataParallel._distributed_broadcast_coalesced", 2363),
    _torch_frame(DDP, "DistributedDataParallel._default_broadcast_coalesced", 2451),
    _torch_frame(DDP, "DistributedDataParallel._sync_module_buffers", 2429),
    _torch_frame(DDP, "DistributedDataParallel._sync_buffers", 2425),
    _torch_frame(DDP, "DistributedDataParallel._pre_forward", 1800),
    _torch_frame(DDP, "DistributedDataParallel.forward", 1900),
    _torch_frame("torch.nn.modules.module", "Module._call_impl", 1790),
    _user("training_function", 140),
    _user("main", 200),
)
ASLEEP = (_user("training_function", 132), _user("main", 200))


def _rank(g: int, frames: tuple[Frame, ...]) -> RankStack:
    main = ThreadStack(g + 100, "MainThread", frames, main=True)
    return RankStack(g, g, ProcessStack(pid=1000 + g, state="S", method="py-spy", threads=(main,)))


def test_ddp_buffer_broadcast_is_a_wait_and_the_sleeper_is_named() -> None:
    assert collective_of(BUFFERS) == "DDP's buffer broadcast"
    # Bare names (faulthandler, the responder) match too.
    bare = tuple(Frame(f.function.rsplit(".", 1)[-1], f.file, f.line, f.path) for f in BUFFERS)
    assert collective_of(bare) == "DDP's buffer broadcast"
    dump = StackDump("t", 1000.0, 0.1, (_rank(0, BUFFERS), _rank(1, ASLEEP)))
    v = verdict(dump)
    assert v.odd == (1,), v.text
    assert v.text == (
        "rank 1 is not in a collective: nlp_example.py:132 in training_function; "
        "rank 0 waits in DDP's buffer broadcast"
    )
    assert v.places[0].place == "DDP's buffer broadcast (nlp_example.py:140 in training_function)"


def test_a_listed_name_in_another_file_or_class_is_no_wait() -> None:
    # The program's own _sync_buffers, and a same-named method of another class of DDP's file.
    assert wait_at(Frame("_sync_buffers", "train.py", 3, "/w/train.py")) is None
    assert wait_at(_torch_frame(DDP, "_DDPSink._sync_buffers")) is None
    assert wait_at(_torch_frame("torch.distributed.distributed_c10d", "get_rank")) is None
    fsdp2 = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
    w = wait_at(_torch_frame(fsdp2, "FSDPParamGroup.wait_for_unshard"))
    assert w is not None and w.says == "FSDP's all-gather"
