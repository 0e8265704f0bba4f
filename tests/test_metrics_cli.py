"""``tuilaunch --metrics-port / --metrics-textfile`` as a user runs it: real launcher processes.

- a 2-rank ``--standalone`` run: ``/metrics`` scraped while it runs and parsed with
  prometheus_client's parser; a rank SIGKILLed by pid moves the restart counter and that rank's
  exit counter; the socket is the launcher's own; the textfile is there while it runs and its
  last write says finished, with the exit status;
- nothing listens when the options are off (the launcher's listening sockets, from
  ``/proc/<pid>/net/tcp*`` matched with the socket inodes of ``/proc/<pid>/fd``, are only the
  rendezvous store's);
- a bad ``--metrics-port``: one line, exit 2, no file, no process;
- two agents on this machine as two nodes: each endpoint exports its own ranks, and together
  they cover every global rank once, under two distinct ``node`` labels.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import WORKERS, Launch, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_bad_input import check_usage_error
from test_multinode import Job, c10d_args, free_port, start

from tui_launch.metrics import textfile_name

# Ranks that run for 300 s and import nothing: what is scraped and listened on is the launcher's.
TICKER_300S = [str(WORKERS / "ticker.py"), "--ticks", "3000"]
NOOP = str(WORKERS / "noop.py")
Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples | None:
    """``GET /metrics`` parsed by prometheus_client; None while nothing answers."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return parse(text)


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def value(s: Samples, name: str, **labels: str) -> float | None:
    rows = [v for lab, v in s.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(rows) <= 1, (name, labels, rows)
    return rows[0] if rows else None


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process ``pid`` itself listens on: its socket inodes (``/proc/PID/fd``)
    matched against the listening rows of its network namespace's tables."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as fp:
            for line in fp.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # TCP_LISTEN, owned by pid
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def rank_pid(launcher: int, local_rank: int) -> int | None:
    """The pid of the launcher's worker with ``LOCAL_RANK=local_rank``."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(launcher).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                env = child.environ()
                if env.get("LOCAL_RANK") == str(local_rank) and "RANK" in env:
                    return child.pid
    return None


def running(port: int, attempt: int, ranks: int = 2) -> Samples | None:
    """A scrape in which ``attempt`` runs ``ranks`` ranks, all up."""
    s = scrape(port)
    if s is None or value(s, "tuilaunch_attempt") != attempt:
        return None
    if value(s, "tuilaunch_workers", state="running") != ranks:
        return None
    up = [v for _, v in s.get("tuilaunch_rank_up", [])]
    return s if len(up) == ranks and all(up) else None


def test_cli_run_scraped_killed_and_finished(tuilaunch, tmp_path: Path):
    port = free_port()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    launch: Launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--monitor-interval",
        "0.2",
        "--metrics-port",
        str(port),
        "--metrics-textfile",
        str(textfile),
        *TICKER_300S,
    )
    before = wait_for(lambda: running(port, 0), 120, what="attempt 0 running, scraped")
    assert port in listening_ports(launch.pid)  # the launcher's own socket, on loopback
    host = socket.gethostname()
    assert {lab["node"] for lab, _ in before["tuilaunch_rank_up"]} == {host}
    assert sorted(lab["rank"] for lab, _ in before["tuilaunch_rank_up"]) == ["0", "1"]
    assert value(before, "tuilaunch_restarts_total", cause="failure") == 0
    assert "tuilaunch_rank_exits_total" not in before
    (info,) = before["tuilaunch_info"]
    run_id = info[0]["run_id"]
    assert run_id and info[0]["node"] == host

    # The textfile is written while the run goes on (the first write comes at once).
    path = textfile / textfile_name(run_id, host)
    wait_for(path.exists, 30, what=f"{path}")
    assert value(parse(path.read_text()), "tuilaunch_run_finished") == 0

    victim = rank_pid(launch.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    after = wait_for(lambda: running(port, 1), 120, what="attempt 1 running, scraped")
    assert value(after, "tuilaunch_restarts_total", cause="failure") == 1
    assert value(after, "tuilaunch_rank_exits_total", rank="1", reason="SIGKILL") == 1
    assert value(after, "tuilaunch_restart_budget_remaining") == 0

    launch.proc.send_signal(signal.SIGTERM)
    code = launch.wait(120)
    assert code == 128 + signal.SIGTERM, launch.output[-3000:]
    final = parse(path.read_text())
    assert value(final, "tuilaunch_run_finished") == 1
    assert value(final, "tuilaunch_run_exit_code") == code
    assert value(final, "tuilaunch_restarts_total", cause="failure") == 1
    assert [p.name for p in textfile.iterdir()] == [path.name]  # no temp file left
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert scrape(port) is None  # closed with the run
    assert f"Prometheus metrics at http://127.0.0.1:{port}/metrics" in launch.stderr


def test_nothing_listens_when_the_options_are_off(tuilaunch):
    store_port = free_port()
    launch = tuilaunch(
        "--nnodes",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{store_port}",
        "--nproc-per-node",
        "2",
        *TICKER_300S,
    )
    wait_for(lambda: rank_pid(launch.pid, 1), 120, what="the workers")
    wait_for(lambda: store_port in listening_ports(launch.pid), 60, what="the rendezvous store")
    # The launcher's only listening socket is torch's rendezvous store.
    assert listening_ports(launch.pid) == {store_port}
    launch.proc.send_signal(signal.SIGTERM)
    assert launch.wait(120) == 128 + signal.SIGTERM


@pytest.mark.parametrize("case", ["zero", "too-big", "in-use"])
def test_bad_metrics_port_creates_nothing(tuilaunch, tmp_path: Path, case: str):
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = str(holder.getsockname()[1])
        port = {"zero": "0", "too-big": "65536", "in-use": busy}[case]
        launch = tuilaunch(
            "--metrics-port", port, "--metrics-textfile", str(textfile), NOOP, cwd=tmp_path
        )
        line = check_usage_error(launch, "--metrics-port", port)
    assert re.search(r"in use" if case == "in-use" else "1-65535", line, re.IGNORECASE), line
    assert [p.name for p in tmp_path.iterdir()] == ["textfile"]
    assert list(textfile.iterdir()) == []


def test_two_agents_on_one_host_export_disjoint_ranks(launches, tmp_path: Path):
    """Two agents on this machine as two nodes of one c10d job, 2 ranks each."""
    job = Job(tmp_path)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    store_port, run_id = free_port(), f"metrics-{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]
    nodes = []
    for p in ports:
        args = c10d_args(store_port, run_id, "2")
        args[args.index("--nproc-per-node") + 1] = "2"
        args += ["--metrics-port", str(p), "--metrics-textfile", str(textfile), *job.script()]
        nodes.append(start(launches, args))

    def both() -> list[Samples] | None:
        got = [running(p, 0) for p in ports]
        if not all(got):
            return None
        # The node labels settle once the rendezvous is sampled: wait for the final ones.
        labels = [{lab["node"] for lab, _ in s["tuilaunch_rank_up"]} for s in got if s]
        return [s for s in got if s] if all("/" in next(iter(x)) for x in labels) else None

    scrapes = wait_for(both, 120, interval=0.5, what="both endpoints with 2 ranks running")
    host = socket.gethostname()
    ranks: list[set[str]] = []
    node_labels = []
    for s in scrapes:
        rows = s["tuilaunch_rank_up"]
        (node,) = {lab["node"] for lab, _ in rows}
        node_labels.append(node)
        ranks.append({lab["rank"] for lab, _ in rows})
        assert {lab["local_rank"] for lab, _ in rows} == {"0", "1"}
    assert sorted(node_labels) == [f"{host}/0", f"{host}/1"]
    assert ranks[0] | ranks[1] == {"0", "1", "2", "3"}
    assert not ranks[0] & ranks[1]
    job.stop.touch()
    for n in nodes:
        assert n.wait(120) == 0, n.output[-3000:]
    names = sorted(p.name for p in textfile.iterdir())
    assert names == sorted(textfile_name(run_id, label) for label in node_labels)
    for name in names:
        assert value(parse((textfile / name).read_text()), "tuilaunch_run_finished") == 1
