"""Every place in torch where a rank waits for its peers, listed once.

A stack verdict asks of each frame: is this a collective, a wait on the other ranks? The
answer is this table, not a guess from file and function names: torch.distributed's public
collectives and object collectives, its point-to-point calls, ``barrier`` and
``monitored_barrier``, the process-group setup that waits for every rank, the functional
collectives, and the framework code that calls native collectives with no Python frame of
c10d under it: DDP's buffer and module-state broadcasts and its join all-reduces, FSDP's
all-gathers and reduce-scatters (FSDP1 and FSDP2), and ``Work.wait``.

Each :class:`Wait` is a module and a qualified name in it, as torch spells them: they are
matched against stack frames, never imported or called, so the core stays free of torch's
private API. ``tests/test_stacks_waits.py`` checks every entry against the installed torch
(each function still exists) and that every public function of
``torch.distributed.distributed_c10d`` is either listed or named there as no wait, so an
upgrade that adds a collective fails by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from tui_launch.core.diagnosis.stacks.model import Frame


@dataclass(frozen=True)
class Wait:
    """One function a rank waits for its peers in: ``module`` (dotted) and ``name`` (its
    qualified name there: ``all_reduce``, ``DistributedDataParallel._sync_buffers``);
    ``label`` is what the verdict calls it (default: the function's own name)."""

    module: str
    name: str
    label: str = ""

    @property
    def bare(self) -> str:
        """The function's own name (``_sync_buffers``)."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def file(self) -> str:
        """The module's file as a stack frame names it (``torch/nn/parallel/distributed.py``)."""
        path = self.module.replace(".", "/")
        return f"{path}/__init__.py" if self.module in _PACKAGES else f"{path}.py"

    @property
    def says(self) -> str:
        """What the verdict calls it."""
        return self.label or self.bare


_PACKAGES = frozenset({"torch.cuda"})
_C10D = "torch.distributed.distributed_c10d"
_FC = "torch.distributed._functional_collectives"
_DDP = "torch.nn.parallel.distributed"
_DIST_UTILS = "torch.distributed.utils"
_FSDP1 = "torch.distributed.fsdp.fully_sharded_data_parallel"
_FSDP1_FLAT = "torch.distributed.fsdp._flat_param"
_FSDP1_RUN = "torch.distributed.fsdp._runtime_utils"
_FSDP2 = "torch.distributed.fsdp._fully_shard"
_FSDP2_COLL = f"{_FSDP2}._fsdp_collectives"
_FSDP2_GROUP = f"{_FSDP2}._fsdp_param_group"

_DDP_BUFFERS = "DDP's buffer broadcast"
_DDP_STATES = "DDP's module-state broadcast"
_FSDP_GATHER = "FSDP's all-gather"
_FSDP_REDUCE = "FSDP's reduce-scatter"

# Public collectives of c10d (each in torch.distributed.distributed_c10d.__all__), the private
# ones that wrap the same calls, and the setup that waits until every rank has come.
_C10D_WAITS = (
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object",
    "all_gather_single", "all_reduce", "all_reduce_coalesced", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "init_process_group", "irecv", "isend", "monitored_barrier",
    "new_group", "new_subgroups", "new_subgroups_by_enumeration", "recv", "recv_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "send_object_list", "shrink_group", "split_group",
    "_all_gather_base", "_reduce_scatter_base", "_store_based_barrier", "Work.wait",
)  # fmt: skip
# The functional collectives (DTensor, torch.compile's eager path): each issues the collective
# and, unless the result is used later, waits for it in wait_tensor.
_FC_WAITS = (
    "wait_tensor", "broadcast", "all_reduce", "all_gather_single", "all_gather_single_autograd",
    "reduce_scatter_single", "reduce_scatter_single_autograd", "all_gather_tensor",
    "all_gather_tensor_autograd", "reduce_scatter_tensor", "reduce_scatter_tensor_autograd",
    "all_reduce_coalesced", "all_gather_single_coalesced", "reduce_scatter_single_coalesced",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "all_to_all_single",
    "all_to_all_single_autograd", "permute_tensor", "all_gather_tensor_inplace",
    "reduce_scatter_tensor_inplace", "all_reduce_inplace", "all_to_all_inplace",
    "all_gather_inplace", "isend_inplace", "irecv_inplace", "batch_p2p_ops_inplace",
    "wait_tensor_backward", "all_reduce_backward", "all_gather_into_tensor_backward",
    "reduce_scatter_tensor_backward", "all_to_all_single_backward",
    "all_reduce_coalesced_backward", "all_gather_into_tensor_coalesced_backward",
    "reduce_scatter_tensor_coalesced_backward", "AsyncCollectiveTensor.wait",
    "AsyncCollectiveTensor.trigger_wait",
)  # fmt: skip

WAITS: tuple[Wait, ...] = (
    *(Wait(_C10D, n) for n in _C10D_WAITS),
    *(Wait(_FC, n) for n in _FC_WAITS),
    Wait("torch.distributed.rendezvous", "rendezvous"),
    # DDP: the forward's buffer broadcast (broadcast_buffers=True, a BatchNorm's running
    # stats), the module-state broadcast and shape check at construction, the join's
    # all-reduces; dist._broadcast_coalesced and Work.wait are native, so these frames are
    # the innermost Python ones a waiting rank shows.
    *(
        Wait(_DDP, f"DistributedDataParallel.{n}", _DDP_BUFFERS)
        for n in (
            "_sync_buffers",
            "_sync_module_buffers",
            "_default_broadcast_coalesced",
            "_distributed_broadcast_coalesced",
            "_check_and_sync_module_buffers",
        )
    ),
    *(
        Wait(_DDP, f"DistributedDataParallel.{n}")
        for n in (
            "_check_global_requires_backward_grad_sync",
            "_match_all_reduce_for_bwd_pass",
            "_match_unused_params_allreduce",
            "_sync_final_model",
            "_register_delay_all_reduce_hook",
        )
    ),
    *(
        Wait(_DIST_UTILS, n, _DDP_STATES)
        for n in ("_sync_module_states", "_sync_params_and_buffers")
    ),
    Wait(_DIST_UTILS, "_verify_param_shape_across_processes", "DDP's parameter-shape check"),
    # FSDP1: the unshard's all-gather, the gradients' reduce-scatter (all-reduce unsharded).
    Wait(_FSDP1_FLAT, "FlatParamHandle._all_gather_flat_param", _FSDP_GATHER),
    Wait(_FSDP1_FLAT, "FlatParamHandle.unshard_grad", _FSDP_GATHER),
    Wait(_FSDP1_RUN, "_unshard", _FSDP_GATHER),
    Wait(_FSDP1_RUN, "_reduce_grad", _FSDP_REDUCE),
    Wait(_FSDP1_RUN, "_reduce_grad_no_shard", "FSDP's gradient all-reduce"),
    Wait(_FSDP1, "FullyShardedDataParallel._unshard", _FSDP_GATHER),
    Wait(_FSDP1, "FullyShardedDataParallel.clip_grad_norm_"),
    # FSDP2 (fully_shard): the all-gather is issued asynchronously and waited for in the copy
    # out; the reduce-scatter in foreach_reduce and the end of backward.
    Wait(_FSDP2_COLL, "foreach_all_gather", _FSDP_GATHER),
    Wait(_FSDP2_COLL, "foreach_all_gather_copy_out", _FSDP_GATHER),
    Wait(_FSDP2_COLL, "DefaultAllGather.__call__", _FSDP_GATHER),
    Wait(_FSDP2_COLL, "ProcessGroupAllocAllGather.__call__", _FSDP_GATHER),
    Wait(_FSDP2_COLL, "foreach_reduce", _FSDP_REDUCE),
    Wait(_FSDP2_COLL, "DefaultReduceScatter.__call__", _FSDP_REDUCE),
    Wait(_FSDP2_COLL, "ProcessGroupAllocReduceScatter.__call__", _FSDP_REDUCE),
    Wait(_FSDP2_GROUP, "FSDPParamGroup.unshard", _FSDP_GATHER),
    Wait(_FSDP2_GROUP, "FSDPParamGroup.wait_for_unshard", _FSDP_GATHER),
    Wait(_FSDP2_GROUP, "FSDPParamGroup.finalize_backward", _FSDP_REDUCE),
    Wait(_FSDP2_GROUP, "FSDPParamGroup.post_backward", _FSDP_REDUCE),
    Wait(f"{_FSDP2}._fully_shard", "FSDPModule.unshard", _FSDP_GATHER),
    # The GPU: an NCCL collective is asynchronous on the host, so a rank stuck in one is
    # usually seen waiting for the device here.
    Wait("torch.cuda", "synchronize"),
    Wait("torch.cuda.streams", "Stream.synchronize"),
    Wait("torch.cuda.streams", "Event.synchronize"),
)

# file -> qualified name -> the entry; file -> bare name -> the entry (the first listed).
_BY_FILE: dict[str, dict[str, Wait]] = {}
_BY_BARE: dict[str, dict[str, Wait]] = {}
for _w in WAITS:
    _BY_FILE.setdefault(_w.file, {}).setdefault(_w.name, _w)
    _BY_BARE.setdefault(_w.file, {}).setdefault(_w.bare, _w)


def _module_file(frame: Frame) -> str | None:
    """The listed module file ``frame`` is in (its full path ends with it), or None."""
    for path in (frame.path, frame.file):
        if not path:
            continue
        for file in _BY_FILE:
            if path == file or path.endswith("/" + file):
                return file
    return None


def wait_at(frame: Frame) -> Wait | None:
    """The listed wait ``frame`` is in, or None. A qualified function name (py-spy's
    ``DistributedDataParallel._sync_buffers``) must match the entry's; a bare one
    (faulthandler's, the responder's) matches by the function's own name."""
    file = _module_file(frame)
    if file is None:
        return None
    function = frame.function
    found = _BY_FILE[file].get(function)
    if found is not None:
        return found
    bare = function.rsplit(".", 1)[-1]
    if "." in function and "<locals>" not in function:
        # Qualified but not listed: another class's method of the same name is no wait.
        return None
    return _BY_BARE[file].get(bare)
