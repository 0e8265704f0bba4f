"""Test worker: what a rank's process looks like from inside, for the warm-start tests.

Usage: ``warm_probe.py OUT_DIR [crash]``. Notes, before importing anything beyond the standard
library, which of ``torch`` and ``pkg.mod`` were already imported, then writes
``OUT_DIR/probe_<attempt>_<rank>.json``: pid, process start time, argv, ``sys.path[0]``,
working directory, ``__name__``, torch's thread count, nice value, session, the parent's pid
and start time. With ``crash``,
rank 0 of attempt 0 notes the time and exits 3; the other ranks wait to be torn down.
Otherwise every rank does one gloo all_reduce and exits 0.
"""

from __future__ import annotations

import sys

PRELOADED = {name: name in sys.modules for name in ("torch", "pkg.mod")}

import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def start_time(pid: str = "self") -> float:
    """A process's start, in seconds since the epoch (from /proc, as ps computes it)."""
    with open(f"/proc/{pid}/stat") as fp:
        ticks = int(fp.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as fp:
        btime = next(int(line.split()[1]) for line in fp if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def proc_environ_is_mine() -> bool:
    """Whether /proc/self/environ (what ps, psutil and monitoring agents read) shows the
    environment this process runs with."""
    with open("/proc/self/environ", "rb") as fp:
        shown = dict(kv.split(b"=", 1) for kv in fp.read().split(b"\0") if b"=" in kv)
    return shown == dict(os.environb)


def cmdline_names_script() -> bool:
    """Whether /proc/self/cmdline (ps, pkill -f) names this script with its arguments."""
    with open("/proc/self/cmdline", "rb") as fp:
        args = [os.fsdecode(a) for a in fp.read().split(b"\0")]
    return os.path.realpath(args[args.index(sys.argv[0])]) == os.path.realpath(__file__) and (
        args[args.index(sys.argv[0]) :][: len(sys.argv)] == sys.argv
    )


def main() -> None:
    out = Path(sys.argv[1])
    crash = sys.argv[2:3] == ["crash"]
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    info = {
        "preloaded": PRELOADED,
        "pid": os.getpid(),
        "started": start_time(),
        "proc_environ": proc_environ_is_mine(),
        "cmdline_names_script": cmdline_names_script(),
        "ppid": os.getppid(),
        "parent_started": start_time(str(os.getppid())),
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "name": __name__,
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "nice": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
    }
    if crash and attempt == 0 and rank == 0:
        info["failed_at"] = time.time()
    tmp = out / f".probe_{attempt}_{rank}.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(out / f"probe_{attempt}_{rank}.json")
    if crash and attempt == 0:
        if rank == 0:
            sys.exit(3)
        time.sleep(60)
        return
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
