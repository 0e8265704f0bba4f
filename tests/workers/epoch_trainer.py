"""Test worker: the fault-tolerant tutorial's shape, as a user wrote it (issue 32).

DDP over gloo, a snapshot every epoch (rank 0 writes it, every rank resumes from it), one
``epoch E rank R`` line per epoch and rank (a format the progress parser need not know).
Rank 1 exits with ``os._exit(1)`` at the start of epoch ``--fail-epoch`` while the attempt
(``TORCHELASTIC_RESTART_COUNT``) is below ``--fail-attempts``, after one line that names the
attempt; from then on it trains to the end.

Options: ``--epochs`` (default 4), ``--fail-epoch`` (2), ``--fail-attempts`` (2),
``--snapshot PATH`` (default: the temp directory, under the launch's run id).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--fail-epoch", type=int, default=2)
    p.add_argument("--fail-attempts", type=int, default=2)
    p.add_argument("--snapshot", default="")
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    snapshot = a.snapshot or os.path.join(tempfile.gettempdir(), f"epoch-trainer-{run_id}.pt")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 1)
    first = 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot)
        model.load_state_dict(state["model"])
        first = state["epochs_run"]
        print(f"rank {rank} resumed from epoch {first}", flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(first, a.epochs):
        if rank == 1 and epoch == a.fail_epoch and attempt < a.fail_attempts:
            print(f"rank {rank}: simulated failure in epoch {epoch}, attempt {attempt}", flush=True)
            os._exit(1)
        print(f"epoch {epoch} rank {rank}", flush=True)
        for _ in range(4):
            opt.zero_grad()
            loss = model(torch.randn(16, 8)).pow(2).mean()
            loss.backward()
            for param in model.parameters():
                assert param.grad is not None
                dist.all_reduce(param.grad)
            opt.step()
        dist.barrier()  # rank 0's snapshot of this epoch is complete before anyone goes on
        if rank == 0:
            torch.save({"model": model.state_dict(), "epochs_run": epoch + 1}, snapshot + ".tmp")
            os.replace(snapshot + ".tmp", snapshot)
        dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
