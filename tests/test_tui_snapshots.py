"""SVG snapshot tests of the dashboard in each deterministic FakeSource state.

The fake has a fixed clock and pinned "last log" times, so every screen is the same on every
run. Baselines live in ``tests/__snapshots__/test_tui_snapshots/``; after a deliberate change
to the UI, regenerate them with::

    .venv/bin/python -m pytest tests/test_tui_snapshots.py --snapshot-update

and look at the changed SVGs before committing them.
"""

from __future__ import annotations

from tui_launch.testing import scenarios
from tui_launch.tui.app import Dashboard

SIZE = (150, 42)


def dashboard(state: str) -> Dashboard:
    return Dashboard(scenarios.STATES[state]())


class TestDashboardSnapshots:
    def test_healthy(self, snap_compare) -> None:
        """Four ranks training in the first attempt; merged logs followed."""
        assert snap_compare(dashboard("healthy"), terminal_size=SIZE)

    def test_waiting_for_nodes(self, snap_compare) -> None:
        """One node of a 2:4 job in the rendezvous, waiting for the others; no ranks yet."""
        assert snap_compare(dashboard("waiting"), terminal_size=SIZE)

    def test_failure_with_traceback(self, snap_compare) -> None:
        """The run failed: the root-cause tab (key c) shows rank 1's traceback."""
        assert snap_compare(dashboard("failure"), terminal_size=SIZE, press=["c"])

    def test_restarting(self, snap_compare) -> None:
        """Rank 1 was SIGKILLed; the agent re-forms the group (restart 1 of 3)."""
        assert snap_compare(dashboard("restarting"), terminal_size=SIZE)

    def test_finished(self, snap_compare) -> None:
        """A run that recovered from one failure and succeeded: control keys are hidden."""
        assert snap_compare(dashboard("finished"), terminal_size=SIZE)

    def test_kill_confirmation(self, snap_compare) -> None:
        """Rank 1 selected, k pressed: the y/n dialog over the dashboard."""
        assert snap_compare(dashboard("healthy"), terminal_size=SIZE, press=["down", "k"])

    def test_help(self, snap_compare) -> None:
        """The ? help screen."""
        assert snap_compare(dashboard("healthy"), terminal_size=SIZE, press=["question_mark"])

    def test_eight_gpus_in_container(self, snap_compare) -> None:
        """8 ranks on 8 fake GPUs, NVML pids from another namespace: GPUs inferred (~) from
        LOCAL_RANK and the UUIDs in CUDA_VISIBLE_DEVICES; compact one-line-per-GPU panel."""
        assert snap_compare(dashboard("gpus8"), terminal_size=SIZE)

    def test_multinode(self, snap_compare) -> None:
        """A 2:4-node job: nodes and heartbeats in the rendezvous panel, a node joined in the
        attempt timeline, one node waiting."""
        assert snap_compare(dashboard("multinode"), terminal_size=SIZE)

    def test_cluster_tab(self, snap_compare) -> None:
        """Key n: the Cluster tab, every node's status from the store; the silent one first."""
        assert snap_compare(dashboard("multinode"), terminal_size=SIZE, press=["n"])

    def test_cluster_tab_with_job_stacks(self, snap_compare) -> None:
        """Issue 14, many nodes: d on node0 reached every node; under the node table, where
        every rank of the job is (rank 1 the odd one out, ranks 0, 2, 3 in all_reduce on two
        nodes) and the silent node that did not answer."""
        assert snap_compare(dashboard("multinode_hung"), terminal_size=SIZE, press=["n"])

    # Issue 17: usable from 80x24 up (the side panels stack below 120 columns and the table
    # drops the columns that matter least), and a store nobody serves explained.
    def test_healthy_80x24(self, snap_compare) -> None:
        assert snap_compare(dashboard("healthy"), terminal_size=(80, 24))

    def test_healthy_120x36(self, snap_compare) -> None:
        assert snap_compare(dashboard("healthy"), terminal_size=(120, 36))

    def test_healthy_200x50(self, snap_compare) -> None:
        assert snap_compare(dashboard("healthy"), terminal_size=(200, 50))

    def test_failure_80x24(self, snap_compare) -> None:
        assert snap_compare(dashboard("failure"), terminal_size=(80, 24), press=["c"])

    def test_connecting_80x24(self, snap_compare) -> None:
        """The launcher waits for a c10d store nobody serves: endpoint, time, retries."""
        assert snap_compare(dashboard("connecting"), terminal_size=(80, 24))

    def test_connect_failed_80x24(self, snap_compare) -> None:
        """It gave up: the error in the header and the root-cause tab, shown at once."""
        assert snap_compare(dashboard("connect_failed"), terminal_size=(80, 24))

    def test_stacks_tab(self, snap_compare) -> None:
        """A confirmed hang: the Stacks tab with the verdict, rank 1 (the odd one out, in
        load_batch) first, ranks 0, 2, 3 folded (x 3 ranks) in all_reduce, the earlier dump
        listed; rank 1 marked HUNG? in the Workers table."""

        async def stacks_tab(pilot) -> None:
            pilot.app._tabs.active = "stacks-tab"
            await pilot.pause()

        assert snap_compare(dashboard("hung"), terminal_size=SIZE, run_before=stacks_tab)

    def test_stacks_tab_flight_recorder(self, snap_compare) -> None:
        """Issue 34: NCCL's dumps of the hung run judged: the Flight Recorder's verdict first
        (rank 1 never issued the collective, in yellow), the groups that name it below, the
        groups with no member out of step counted, then the stacks as before."""

        async def stacks_tab(pilot) -> None:
            pilot.app._tabs.active = "stacks-tab"
            await pilot.pause()

        assert snap_compare(dashboard("nccl_timeout"), terminal_size=SIZE, run_before=stacks_tab)

    # Issue 23, at 80x24: the inject menu whole (its right border, the refused kinds' reason,
    # the buttons), the help scrolling instead of cut, the GPU panel one short line per GPU
    # with nothing cut, the Restarts counters on one line each.
    def test_inject_menu_80x24(self, snap_compare) -> None:
        """i on rank 0 of a run without the worker bootstrap: exit and exception greyed out,
        and why."""
        src = scenarios.STATES["healthy"]()
        src.inject_ready = False
        assert snap_compare(Dashboard(src), terminal_size=(80, 24), press=["i"])

    def test_help_80x24(self, snap_compare) -> None:
        """The ? help on 80x24: the rows scroll (scrollbar), title and foot stay."""
        assert snap_compare(dashboard("healthy"), terminal_size=(80, 24), press=["question_mark"])

    def test_gpus_80x24(self, snap_compare) -> None:
        """8 GPUs on 80x24: the stacked GPU panel, one short line per GPU, nothing cut."""
        assert snap_compare(dashboard("gpus8"), terminal_size=(80, 24))
