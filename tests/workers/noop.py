"""Test worker: join the gloo process group, all_reduce one element, leave."""

from __future__ import annotations

import torch
import torch.distributed as dist


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == dist.get_world_size()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
