"""Regenerate ``screenshots/*.svg`` from the real dashboard.

Run from the repository root::

    .venv/bin/python scripts/screenshots.py             # the five states + a live demo run
    .venv/bin/python scripts/screenshots.py --no-live   # only the five deterministic states

Each state of :mod:`tui_launch.testing.scenarios` (healthy, waiting, failure, restarting,
finished) is shown by the real :class:`~tui_launch.tui.app.Dashboard` under ``App.run_test``
at 150x42 and saved with ``App.save_screenshot``; the failure is shown on its root-cause tab.
These are deterministic (a fixed clock): running the script again rewrites the same files.

``live-demo.svg`` comes from a real job instead: a :class:`~tui_launch.core.run.runner.Runner`
running ``tests/workers/steady.py`` on 2 CPU ranks, seen through
:class:`~tui_launch.tui.sources.live.LiveSource`; the screenshot is taken once the run is up and a
few
log lines are in, then the job is stopped. Its pids, run id and times differ on every run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "screenshots"
SIZE = (150, 42)
# state name -> keys pressed before the screenshot
STATES: dict[str, tuple[str, ...]] = {
    "healthy": (),
    "waiting": (),
    "failure": ("c",),  # the root-cause tab, with the traceback
    "restarting": (),
    "finished": (),
    "gpus8": (),  # 8 ranks, 8 fake GPUs, GPUs inferred from UUIDs (a container)
    "multinode": (),  # an elastic 2:4-node job: nodes, heartbeats, a node joined
}
# extra screenshots: file name -> (state, keys)
EXTRA: dict[str, tuple[str, tuple[str, ...]]] = {
    "cluster": ("multinode", ("n",)),  # the Cluster tab: every node's status from the store
    "small": ("healthy", ()),  # the smallest supported terminal (SIZES)
    "connect-failed": ("connect_failed", ()),  # a c10d store nobody serves, on 80x24
    "stacks": ("hung", ("d",)),  # a hang: d dumps again, the Stacks tab shows the verdict
    # NCCL's dumps of that hang judged by tuilaunch why's judge: first in the Stacks tab
    "stacks-nccl": ("nccl_timeout", ("d",)),
    # many nodes: d reached every node; the Cluster tab shows where every rank of the job is
    "cluster-stacks": ("multinode_hung", ("n",)),
}
# screenshots taken at another size than SIZE
SIZES: dict[str, tuple[int, int]] = {"small": (80, 24), "connect-failed": (80, 24)}


def _stable_ids(svg_path: Path, name: str) -> None:
    """Rich puts a random id in every SVG: a fixed one keeps regenerated files identical."""
    text = svg_path.read_text(encoding="utf-8")
    text = re.sub(r"\bterminal-\d+-", f"terminal-{name}-", text)
    svg_path.write_text(text, encoding="utf-8")


async def _shoot(
    app: Any, path: Path, press: tuple[str, ...] = (), size: tuple[int, int] = SIZE
) -> None:
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        if press:
            await pilot.press(*press)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        app.save_screenshot(filename=path.name, path=str(path.parent))


def fake_states(names: list[str]) -> list[Path]:
    """Screenshots of the deterministic fake states."""
    from tui_launch.testing import scenarios
    from tui_launch.tui.app import Dashboard

    written = []
    for name in names:
        path = OUT / f"{name}.svg"
        state, keys = EXTRA.get(name) or (name, STATES[name])
        app = Dashboard(scenarios.STATES[state]())
        asyncio.run(_shoot(app, path, keys, SIZES.get(name, SIZE)))
        _stable_ids(path, name)
        written.append(path)
    return written


def live_demo(timeout: float = 180.0) -> Path:
    """A screenshot of a real 2-rank run of tests/workers/steady.py."""
    from tui_launch.core.launch.args import parse
    from tui_launch.core.model.store import RunStore
    from tui_launch.core.run.config import RunConfig
    from tui_launch.core.run.runner import Runner
    from tui_launch.tui.app import Dashboard
    from tui_launch.tui.sources.live import LiveSource

    steady = "tests/workers/steady.py"  # relative to ROOT, the working directory
    argv = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "3", steady]
    args, _ = parse([*argv, "--seconds", "120"])
    # Workers inherit this: no import-time UserWarnings of the local torch build in the picture.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    from tui_launch.core.telemetry import Telemetry

    store = RunStore()
    # As the command line builds it: CPU and memory per rank; on this GPU-less machine the
    # GPU panel says why it is empty.
    telemetry = Telemetry(store.post, interval=1.0, gpu=True, journal_every=10.0)
    runner = Runner(
        args, store, RunConfig(echo=False, mute_agent_console=True), telemetry=telemetry
    )
    path = OUT / "live-demo.svg"

    async def shoot() -> None:
        source = LiveSource(runner)
        app = Dashboard(source, refresh_hz=10)
        async with app.run_test(size=SIZE) as pilot:
            deadline = time.monotonic() + timeout
            while not (
                source.snapshot().phase == "running"
                and all(len(source.logs.lines(r)) >= 8 for r in (0, 1))
            ):
                if runner.done or time.monotonic() > deadline:
                    snap = source.snapshot()
                    raise RuntimeError(
                        f"the demo run did not get going (phase {snap.phase}, "
                        f"{source.logs.seq} log lines, done={runner.done})"
                    )
                await pilot.pause(0.2)
            await pilot.pause(2.5)  # telemetry samples (1 s) and the clock frame: every panel drawn
            await pilot.wait_for_scheduled_animations()
            app.save_screenshot(filename=path.name, path=str(path.parent))

    runner.start()
    try:
        asyncio.run(shoot())
    finally:
        if not runner.done:
            runner.stop()
        runner.wait(60)
    _stable_ids(path, "live-demo")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-live", action="store_true", help="skip the live demo run")
    parser.add_argument(
        "states", nargs="*", metavar="STATE", help=f"only these of {', '.join([*STATES, *EXTRA])}"
    )
    ns = parser.parse_args(argv)
    unknown = [s for s in ns.states if s not in STATES and s not in EXTRA]
    if unknown:
        parser.error(f"unknown state(s): {', '.join(unknown)}")
    OUT.mkdir(exist_ok=True)
    os.chdir(ROOT)
    for path in fake_states(ns.states or [*STATES, *EXTRA]):
        print(f"wrote {path.relative_to(ROOT)}")
    if not ns.no_live and not ns.states:
        try:
            path = live_demo()
        except Exception as e:  # the five states are written; say why the demo is not
            print(f"live demo failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
