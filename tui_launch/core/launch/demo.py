"""``tuilaunch --demo``: the example fault-tolerant trainer, with a failure injected for you."""

from __future__ import annotations

import os
import tempfile

# tui_launch/examples/train_ddp.py (this file is tui_launch/core/launch/demo.py)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_SCRIPT = os.path.join(_PACKAGE, "examples", "train_ddp.py")


# --demo's length: about three minutes on 2 cores (or until q), long enough to try k and r
# after the kill on purpose; at 12 epochs it was over in 23 s.
DEMO_EPOCHS = 100


def demo_argv() -> list[str]:
    """``--demo``: the example trainer, 2 workers, 3 restarts allowed."""
    return [
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        DEMO_SCRIPT,
        "--epochs",
        str(DEMO_EPOCHS),
        "--snapshot-path",
        demo_snapshot_path(),
    ]


def demo_snapshot_path() -> str:
    """Where ``--demo``'s trainer keeps its snapshot: the launcher removes it at the end."""
    return os.path.join(tempfile.gettempdir(), f"tuilaunch-demo-{os.getpid()}.pt")


# --demo's failure: rank 1 SIGKILLed once, a few epochs into the first attempt, so that the
# dashboard shows a root cause and a restart that resumes from the snapshot.
DEMO_INJECT = "kill:rank=1,after=10s,attempt=0"
