"""Slurm: the rendezvous an allocation implies, read from the environment alone.

``srun tuilaunch train.py`` inside an allocation needs no rendezvous flags: this module turns
the variables Slurm sets for a job step into torchrun's options, and each option the user gave
(on the command line or as torch's ``PET_*`` variable) is left as it is.

- **Where**: a job step (``SLURM_JOB_ID`` and ``SLURM_STEP_ID``) with one task per node, so each
  node runs one launcher (several tasks on a node would start several launchers, each starting
  every worker: refused). Outside a step (the batch script, an ``salloc`` shell) only a one-node
  allocation is taken as it is; a bigger one is refused unless ``--nnodes`` is given, since one
  launcher would wait for nodes that never join. A ``SLURM_JOB_ID`` with nothing else of an
  allocation (no node list, no node name, not a step: a variable left over in a shell) is no
  Slurm launch: the run goes on as torchrun's would, with a note that says so.
- **nnodes**: the step's node count (``SLURM_STEP_NUM_NODES``; ``srun -N2`` inside a 4-node job
  runs 2 launchers).
- **rendezvous**: c10d, its store on the first host of the step's node list
  (``SLURM_STEP_NODELIST``, the job's when outside a step; Slurm's hostlist syntax expanded here,
  without ``scontrol``) at port 20000 + job id mod 10000 (every node computes the same port
  without talking to the others; below Linux's ephemeral range, so an outgoing connection
  cannot hold it), and ``is_host`` set on that node only (by its Slurm node name), so that
  torch need not guess from host names which node serves the store. One node: a local store
  on a free port, as ``--standalone``.
- **run id**: ``SLURM_JOB_ID``; **node rank**: ``SLURM_NODEID``, for the static backend only
  (``--master-addr`` given; c10d numbers the nodes itself).
- **workers per node**: the GPUs Slurm gave this node (``SLURM_GPUS_ON_NODE``), else torch's
  default of 1: Slurm's task counts describe the launchers, not the workers, and CPUs are not
  workers. ``--nproc-per-node`` sets it.

Nothing here acts: :func:`detect` reads an environment, :func:`plan` returns the options and the
notes that say where each value came from. ``--standalone``, ``--no-slurm``, or explicit
``--rdzv-endpoint``/``--master-addr`` settings leave the rendezvous to the user.
"""

from __future__ import annotations

import argparse
import re
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

PORT_BASE = 20000
PORT_SPAN = 10000

# torchrun's options that set up the rendezvous by hand: given any of them, the user chose
# where the store is, and only the sizes and ids below are filled in.
RENDEZVOUS_DESTS = frozenset(
    {"rdzv_backend", "rdzv_endpoint", "master_addr", "master_port", "standalone"}
)
FILLED_DESTS = ("nnodes", "nproc_per_node", "rdzv_id", "node_rank")


class SlurmError(ValueError):
    """The Slurm environment cannot be used as it is (the message says what to do)."""


@dataclass(frozen=True)
class SlurmJob:
    """What Slurm says about the job step this process runs in.

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        step_id: ``SLURM_STEP_ID`` (None outside a job step: a batch script, an salloc shell).
        node_name: this node's Slurm name (``SLURMD_NODENAME``), if known.
        node_id: this node's index in the step (``SLURM_NODEID``; 0 outside a step).
        hosts: the step's nodes in order (the job's outside a step).
        tasks: the step's task count (the job's outside a step, 1 if not said).
        gpus_on_node: the GPUs allocated on this node (``SLURM_GPUS_ON_NODE``), if said.
    """

    job_id: str
    step_id: str | None
    node_name: str | None
    node_id: int
    hosts: tuple[str, ...]
    tasks: int
    gpus_on_node: int | None

    @property
    def nnodes(self) -> int:
        """The step's node count."""
        return len(self.hosts)

    @property
    def in_step(self) -> bool:
        """Started by ``srun`` (a job step), not the batch script or an salloc shell."""
        return self.step_id is not None

    @property
    def stray(self) -> bool:
        """Only the job id is set: no node list, no node name, not a job step."""
        return not self.hosts


@dataclass(frozen=True)
class SlurmPlan:
    """torchrun's options an allocation implies, and where each came from.

    Attributes:
        job: the job step.
        values: torchrun's namespace fields to set (only those the user did not give).
        notes: one line per decision, said when the run starts.
        rdzv_conf: ``KEY=VALUE`` items for ``--rdzv-conf``, each added to the user's unless
            it names that key.
    """

    job: SlurmJob
    values: Mapping[str, object]
    notes: tuple[str, ...]
    rdzv_conf: tuple[str, ...] = ()

    def apply(self, args: argparse.Namespace) -> argparse.Namespace:
        """A copy of ``args`` with the plan's values set (``is_host`` joins the user's
        ``--rdzv-conf`` unless that names ``is_host`` itself)."""
        values = dict(self.values)
        conf = str(getattr(args, "rdzv_conf", "") or "")
        for item in self.rdzv_conf:
            conf = merge_rdzv_conf(conf, item)
        if self.rdzv_conf:
            values["rdzv_conf"] = conf
        return argparse.Namespace(**{**vars(args), **values})


def merge_rdzv_conf(conf: str, item: str) -> str:
    """``conf`` (torchrun's ``KEY=VALUE,...``) with ``item`` added unless its key is there."""
    key = item.split("=", 1)[0]
    keys = {part.split("=", 1)[0].strip() for part in conf.split(",") if part.strip()}
    if key in keys:
        return conf
    return f"{conf},{item}" if conf.strip() else item


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax as names, in order: ``node[01-03,07],gpu1`` gives ``node01``,
    ``node02``, ``node03``, ``node07``, ``gpu1``.

    Ranges keep the lower bound's zero padding (``n[08-10]``: ``n08 n09 n10``); several bracket
    groups in one name multiply out, the leftmost slowest (``a[1-2]b[1-2]``: ``a1b1 a1b2 a2b1
    a2b2``), as ``scontrol show hostnames`` does. Raises :class:`SlurmError` on a malformed list.
    """
    names: list[str] = []
    for item in _split_top(text.strip()):
        if item:
            names.extend(_expand_one(item, text))
    return names


def _split_top(text: str) -> list[str]:
    # Commas separate names only outside brackets: n[1,3],m splits into n[1,3] and m.
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _expand_one(item: str, whole: str) -> list[str]:
    out = [""]
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            if "]" in rest:
                raise SlurmError(f"bad Slurm node list {whole!r}: ']' without '['")
            return [o + rest for o in out]
        close_at = rest.find("]", open_at)
        if close_at < 0 or "[" in rest[open_at + 1 : close_at]:
            raise SlurmError(f"bad Slurm node list {whole!r}: unbalanced '['")
        prefix, body = rest[:open_at], rest[open_at + 1 : close_at]
        if "]" in prefix:
            raise SlurmError(f"bad Slurm node list {whole!r}: ']' without '['")
        values = _expand_ranges(body, whole)
        out = [o + prefix + v for o in out for v in values]
        rest = rest[close_at + 1 :]
    return out


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise SlurmError(f"bad Slurm node list {whole!r}: {part!r} is not N or N-M")
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise SlurmError(f"bad Slurm node list {whole!r}: {part!r} counts down")
        if hi - lo > 100_000:
            raise SlurmError(f"bad Slurm node list {whole!r}: {part!r} is too long a range")
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SlurmError(f"{name}={text!r} is not a number") from None


def detect(env: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job this environment belongs to, or None outside Slurm.

    Raises :class:`SlurmError` when Slurm's variables contradict each other or cannot be read.
    """
    job_id = env.get("SLURM_JOB_ID", "").strip() or env.get("SLURM_JOBID", "").strip()
    if not job_id:
        return None
    step_id = env.get("SLURM_STEP_ID", "").strip() or env.get("SLURM_STEPID", "").strip()
    in_step = bool(step_id)
    if in_step:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        count = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES")
        tasks = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS") or 1
        node_id = _int(env, "SLURM_NODEID") or 0
    else:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        count = _int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES")
        tasks = _int(env, "SLURM_NTASKS") or 1
        node_id = 0
    hosts = tuple(expand_hostlist(nodelist))
    name = env.get("SLURMD_NODENAME", "").strip()
    if not hosts and not in_step and count in (None, 1) and not name:
        # A job id alone (left over in a shell, copied into a container): torchrun ignores it.
        return SlurmJob(
            job_id=job_id,
            step_id=None,
            node_name=None,
            node_id=0,
            hosts=(),
            tasks=tasks,
            gpus_on_node=None,
        )
    if not hosts:
        if count not in (None, 1) or not name:
            raise SlurmError(f"Slurm job {job_id} gives no node list (SLURM_JOB_NODELIST)")
        hosts = (name,)
    if count is not None and count != len(hosts):
        raise SlurmError(
            f"Slurm job {job_id}: the node list {nodelist!r} names {len(hosts)} node(s) "
            f"but Slurm counts {count}"
        )
    if not 0 <= node_id < len(hosts):
        raise SlurmError(f"Slurm job {job_id}: SLURM_NODEID={node_id} is not one of its nodes")
    return SlurmJob(
        job_id=job_id,
        step_id=step_id if in_step else None,
        node_name=env.get("SLURMD_NODENAME", "").strip() or None,
        node_id=node_id,
        hosts=hosts,
        tasks=tasks,
        gpus_on_node=_int(env, "SLURM_GPUS_ON_NODE"),
    )


def rendezvous_port(job_id: str) -> int:
    """The c10d store's port for a job: the same on every node, different for most jobs."""
    n = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return PORT_BASE + n % PORT_SPAN


def given_from_env(env: Mapping[str, str], dests: Collection[str]) -> set[str]:
    """Which of torchrun's options ``dests`` the environment sets (torch reads ``PET_<DEST>``)."""
    return {d for d in dests if env.get(f"PET_{d.upper()}", "") != ""}


def plan(job: SlurmJob, given: Collection[str], backend: str = "static") -> SlurmPlan:
    """torchrun's options for ``job``, leaving alone every option in ``given`` (torchrun's
    namespace names the user set, on the command line or as ``PET_*``); ``backend``: the
    rendezvous backend the command line asks for (the node rank only matters to ``static``).

    Raises :class:`SlurmError` when the step would start several launchers on a node, or when
    one launcher outside a step would wait for nodes that never run one.
    """
    given = set(given)
    values: dict[str, object] = {}
    conf_items: list[str] = []
    where = f"Slurm job {job.job_id}"
    if job.stray:
        return SlurmPlan(
            job=job,
            values={},
            notes=(
                f"slurm: SLURM_JOB_ID={job.job_id} is set but nothing else of an allocation "
                "(no node list, not a job step): launching as torchrun would",
            ),
        )
    if "standalone" in given:
        return SlurmPlan(
            job=job, values={}, notes=(f"slurm: {where}; --standalone: this node alone",)
        )
    if "nnodes" not in given:
        if job.in_step and job.tasks > job.nnodes:
            raise SlurmError(
                f"srun started {job.tasks} tasks on {job.nnodes} node(s): tuilaunch starts "
                "the workers itself and must run once per node "
                "(srun --ntasks-per-node=1 tuilaunch ..., and --nproc-per-node for the "
                "workers), or give --nnodes to launch as you set it up"
            )
        if not job.in_step and job.nnodes > 1:
            raise SlurmError(
                f"this is {where} on {job.nnodes} nodes, but not a job step: run "
                "srun --ntasks-per-node=1 tuilaunch ... to start one launcher on every node, "
                "or give --nnodes 1 (or --no-slurm) to run on this node alone"
            )
        values["nnodes"] = str(job.nnodes)
    if "rdzv_id" not in given:
        values["rdzv_id"] = job.job_id
    own_rendezvous = bool(given & RENDEZVOUS_DESTS)
    if "node_rank" not in given and own_rendezvous and backend == "static":
        # --master-addr with the static backend: each node must say which one it is.
        values["node_rank"] = job.node_id
    if "nproc_per_node" not in given and job.gpus_on_node:
        values["nproc_per_node"] = str(job.gpus_on_node)
    nodes = int(str(values.get("nnodes", job.nnodes)).split(":")[-1])
    store = ""
    if not own_rendezvous:
        values["rdzv_backend"] = "c10d"
        if nodes <= 1:
            # One node: a local store on a free port, as --standalone (two jobs sharing a
            # node cannot collide on a port they did not choose).
            values["rdzv_endpoint"] = "localhost:0"
            store = "a local c10d store (one node)"
        else:
            first = job.hosts[0]
            endpoint = f"{first}:{rendezvous_port(job.job_id)}"
            values["rdzv_endpoint"] = endpoint
            store = f"c10d store at {endpoint} (the first node"
            if job.node_name is not None:
                hosting = job.node_name == first
                store += ": this one" if hosting else ""
                # Added to the user's --rdzv-conf (timeouts, say) unless it says is_host.
                conf_items.append(f"is_host={int(hosting)}")
            store += ")"
    step = f"{job.job_id}.{job.step_id}" if job.in_step else f"{job.job_id} (batch)"
    node = f"node {job.node_id} of {job.nnodes}" + (f" ({job.node_name})" if job.node_name else "")
    parts = [f"slurm: step {step}, {node}"]
    if "nnodes" in values:
        parts.append(f"--nnodes {values['nnodes']}")
    if store:
        parts.append(store)
    if "rdzv_id" in values:
        parts.append(f"run id {values['rdzv_id']}")
    if "node_rank" in values:
        parts.append(f"--node-rank {values['node_rank']}")
    if "nproc_per_node" in values:
        parts.append(f"{values['nproc_per_node']} worker(s) per node (its GPUs)")
    notes = ["; ".join(parts)]
    kept = sorted(given & {*FILLED_DESTS, *RENDEZVOUS_DESTS})
    if kept:
        flags = ", ".join("--" + d.replace("_", "-") for d in kept)
        notes.append(f"slurm: kept your {flags}")
    return SlurmPlan(job=job, values=values, notes=tuple(notes), rdzv_conf=tuple(conf_items))
