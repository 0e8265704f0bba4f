"""Benchmark workload: join a gloo process group, all_reduce one element, leave.

Used by ``bench/run.py launch`` to measure what a launcher adds around a job that does
nothing: the wall time is almost all interpreter start, ``import torch``, rendezvous and
teardown. Given a directory (``noop.py DIR``), each rank also writes the CPU time it used to
``DIR/cpu_<rank>``, so that the launcher's own CPU time can be told apart from the workers'.
"""

from __future__ import annotations

import os
import resource
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    if len(sys.argv) > 1:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        with open(os.path.join(sys.argv[1], f"cpu_{os.environ['RANK']}"), "w") as fp:
            fp.write(repr(ru.ru_utime + ru.ru_stime))


if __name__ == "__main__":
    main()
