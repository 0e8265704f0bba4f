"""Real agents as a cluster (issue 36): 4 ``tuilaunch`` agents, one killed, one rank hung.

The harness is ``bench/agents.py``'s :class:`Bed`, the one the benchmark runs at 16 agents:
4 real ``tuilaunch --no-tui`` agents on localhost (``--nnodes 3:4 --nproc-per-node 1
--max-restarts 1 --control-socket``), one gloo worker each (``bench/workloads/hangable.py``),
over the c10d store (hosted by agent 0) and over a real etcd (``etcd-v2``), every agent but
the store's host reaching the store through a proxy that counts each request. The checks, in
the order the job lives them:

- the cluster view of one agent (its headless ``cluster`` lines) shows all 4 nodes running;
- the proxy sees tuilaunch's requests (keys under ``tuilaunch/``) and torch's apart, and a
  probe times torch's own keep-alive operations against the same store;
- the last agent is SIGKILLed: every survivor's journal names the lost node in a
  ``node_change`` to a world of 3, their ranks come back in a world of 3 (restarts caused
  by a failure or a membership change, as torch's elastic rules decide), the killed agent's
  worker goes with it, and the viewing agent shows the lost node LOST and the 3 others
  running;
- a rank on another node hangs in ``load_batch``; ``tuilaunch ctl <viewer> dump`` asks the
  viewer, whose job-wide verdict names that rank, with every rank of the job and no node
  missing;
- every process is gone at the end.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TOKEN_VAR, base_env, wait_gone

pytestmark = pytest.mark.slow


def _bench() -> Any:
    """``bench/agents.py`` as a module (bench/ is no package; the file puts bench/ on the path
    for its own ``storeproxy``)."""
    path = ROOT / "bench" / "agents.py"
    spec = importlib.util.spec_from_file_location("bench_agents", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_agents"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["c10d", "etcd-v2"])
def backend(request: pytest.FixtureRequest) -> tuple[str, int | None]:
    """The rendezvous backend, and the etcd server's port for etcd-v2."""
    if request.param == "etcd-v2":
        return request.param, request.getfixturevalue("etcd_server")[1]
    return request.param, None


def test_four_agents_view_lose_a_node_and_name_a_hung_rank(
    backend: tuple[str, int | None], tmp_path: Path
) -> None:
    agents = _bench()
    name, etcd_port = backend
    token = uuid.uuid4().hex
    bed = agents.Bed(
        4,
        name,
        tmp_path,
        env=base_env(),
        token_var=TOKEN_VAR,
        token=token,
        rdzv_conf=agents.FAST_RDZV_CONF,
        etcd_port=etcd_port,
        cluster_interval="0.5",
        log=print,
    )
    try:
        bed.start()
        formed = bed.form(300)
        assert formed["nodes_in_view"] == 4 and formed["group_ranks"] == [0, 1, 2, 3]

        steady = bed.steady(4.0)
        ours, torchs = steady["store"]["tuilaunch"], steady["store"]["torch"]
        writes = ours["by_op_per_s"].get("set", 0) + ours["by_op_per_s"].get("put", 0)
        assert ours["requests_per_s"] > 0 and writes > 0, ours  # each node's record, published
        assert torchs["requests_per_s"] > 0, torchs  # the rendezvous's keep-alives
        assert steady["store_unparsed_connections"] == 0
        assert steady["keep_alive_ms"]["keep_alive"]["n"] > 0, steady["keep_alive_ms"]
        assert steady["viewer_rss_mb"] and steady["viewer_cpu_pct"] is not None

        lost = bed.lose_one(300)
        assert lost["survivors_told"] == 3
        for index, causes in lost["restart_causes"].items():
            assert causes and set(causes) <= {"failure", "membership"}, (index, causes)
            assert causes.count("failure") <= 1, (index, causes)  # --max-restarts 1
        assert lost["killed_workers_gone_s"] is not None  # no orphan of the killed agent
        assert lost["view_running"] == 3 and lost["view_lost"] == lost["killed_node"]

        dump = bed.hang_and_dump(90)
        hung = dump["hung_rank"]
        # The Flight Recorder's verdict (the default), with where the hung rank is.
        assert dump["verdict"].startswith(f"rank {hung} never issued all_reduce #"), dump
        assert "hangable.py:" in dump["verdict"] and "in load_batch" in dump["verdict"], dump
        assert "wait in it" in dump["verdict"] and "no answer" not in dump["verdict"], dump
        assert dump["odd_ranks"] == [hung]
        assert dump["ranks"] == [0, 1, 2] and dump["nodes"] == 3 and dump["missing"] == []
    finally:
        closed = bed.close()
    assert closed["leftover_processes"] == 0, closed
    assert wait_gone(token, 10) == []
