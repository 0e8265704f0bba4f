"""``srun tuilaunch`` and ``sbatch`` against a real Slurm started on this machine.

The module's fixture starts munged, slurmctld and two slurmd (one when this host cannot hold
two; see ``tests/slurm_cluster.py``) in a temporary directory and stops them at the end; the
tests skip with the reason when the daemons cannot start. Jobs are submitted as a user would:
``srun -N1 tuilaunch ...`` with no rendezvous flag, and the README's ``sbatch`` script on two
nodes, whose ranks must span both slurmd. Workers are the real gloo jobs of
``tests/workers/``; their environment says which node and job each rank ran in.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PY, ROOT, WORKERS, base_env, read_journal, wait_for, wait_gone
from slurm_cluster import ClusterUnavailable, SlurmCluster, start_cluster

from tui_launch.core.launch.slurm import expand_hostlist, rendezvous_port

pytestmark = pytest.mark.slow

ENV_DUMP = str(WORKERS / "env_dump.py")
ELASTIC = str(WORKERS / "elastic.py")
TUILAUNCH = (PY, "-m", "tui_launch")
JOB_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    try:
        c = start_cluster(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as e:
        pytest.skip(f"no Slurm here: {e}")
    try:
        yield c
    finally:
        c.stop()


class Job:
    """A job's environment (the cluster's SLURM_CONF, a token its processes inherit)."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.env = cluster.env(base_env())
        self.token = self.env.setdefault("TUILAUNCH_TEST_TOKEN", os.urandom(8).hex())

    def check_gone(self) -> None:
        left = wait_gone(self.token, 20)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind: {left}"


@pytest.fixture
def job(cluster: SlurmCluster) -> Iterator[Job]:
    j = Job(cluster)
    yield j
    j.check_gone()


def srun(job: Job, *argv: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["srun", "--time=10", *argv],
        env=job.env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def journals(output: str) -> list[list[dict]]:
    paths = [
        ln.split(": ", 1)[1].strip() for ln in output.splitlines() if ln.startswith("journal: ")
    ]
    return [read_journal(Path(p)) for p in paths]


def first(events: list[dict], kind: str) -> dict:
    return next(e for e in events if e["kind"] == kind)


def env_dumps(out: Path) -> dict[int, dict[str, str]]:
    return {
        int(p.stem.split("_")[1]): json.loads(p.read_text())["env"] for p in out.glob("env_*.json")
    }


def attach_through_srun(job: Job, job_id: str, pid: str) -> str:
    """``srun --overlap --jobid J --pty tuilaunch attach PID`` on a terminal: wait for the
    dashboard to show the run, press q, return the screen's text (escapes removed)."""
    master, slave = pty.openpty()
    # A terminal as wide as a real one: the header and the Rendezvous panel both fit.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(
        ["srun", "--overlap", f"--jobid={job_id}", "-N1", "--pty", *TUILAUNCH, "attach", pid],
        env={**job.env, "TERM": "xterm-256color"},
        cwd=ROOT,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    shown = bytearray()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                shown.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def text() -> str:
        return re.sub(r"\x1b\[[0-9;?<>=$]*[a-zA-Z~]", "", shown.decode("utf-8", "replace"))

    try:
        wait_for(lambda: f"slurm job {job_id}" in text(), 120, what="the attached dashboard")
        os.write(master, b"q")
        assert proc.wait(60) == 0, text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(5)
        os.close(master)
    return text()


def test_hostlist_expands_as_scontrol_does(cluster: SlurmCluster):
    for text in ("node[01-03,07],gpu1", "a[8-11]b[1-2]", "rack1-n[09-11]", "x[1,3-4],y", "n[9-10]"):
        out = cluster.run("scontrol", "show", "hostnames", text)
        assert out.returncode == 0, out.stderr
        assert expand_hostlist(text) == out.stdout.split(), text


def test_srun_one_node(cluster: SlurmCluster, job: Job, tmp_path: Path):
    """``srun -N1 tuilaunch --nproc-per-node 2 script``: no rendezvous flag, headless by
    itself (srun gives no terminal), the job id as the run id, in the journal and the workers'
    environment."""
    out = tmp_path / "out"
    done = srun(
        job, "-N1", "-n1", *TUILAUNCH, "--log-dir", str(tmp_path / "logs"),
        "--nproc-per-node", "2", ENV_DUMP, str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "stdout or stdin is not a terminal: running headless" in done.stderr
    ranks = env_dumps(out)
    assert sorted(ranks) == [0, 1]
    job_id = ranks[0]["SLURM_JOB_ID"]
    assert {r["TORCHELASTIC_RUN_ID"] for r in ranks.values()} == {job_id}
    assert {r["WORLD_SIZE"] for r in ranks.values()} == {"2"}
    [events] = journals(done.stdout + done.stderr)
    started = first(events, "run_started")
    assert started["slurm_job"] == job_id and started["run_id"] == job_id
    assert started["backend"] == "c10d" and (started["min_nodes"], started["max_nodes"]) == (1, 1)
    assert any(n.startswith(f"slurm: step {job_id}.") for n in started["notes"]), started["notes"]
    assert f"| slurm job {job_id}" in done.stderr
    assert first(events, "run_finished")["exit_code"] == 0


def test_several_tasks_per_node_refused(cluster: SlurmCluster, job: Job, tmp_path: Path):
    """``srun -n2`` on one node would start two launchers, each starting every worker."""
    out = tmp_path / "out"
    done = srun(job, "-N1", "-n2", *TUILAUNCH, ENV_DUMP, str(out))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if "tuilaunch: error:" in ln]
    assert len(lines) == 2 and all("srun started 2 tasks on 1 node(s)" in ln for ln in lines)
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_sbatch_two_nodes(cluster: SlurmCluster, job: Job, tmp_path: Path):
    """The README's batch script on two nodes: one launcher per node, the store on the first
    host of the node list, ranks on both slurmd; ``srun --overlap --jobid`` reaches the running
    job (``tuilaunch ls`` there shows it with its Slurm job id, ``tuilaunch attach`` its
    dashboard); the job completes."""
    if len(cluster.nodes) < 2:
        pytest.skip(f"one Slurm node only: {cluster.single_reason}")
    ranks_log, stop = tmp_path / "ranks.log", tmp_path / "stop"
    ranks_log.touch()
    script = tmp_path / "train.sbatch"
    launcher = " ".join(TUILAUNCH)
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --ntasks-per-node=1 --time=10\n"
        f"#SBATCH --output={tmp_path}/slurm-%j.out\n"
        f"srun {launcher} --log-dir {tmp_path}/logs --monitor-interval 0.2 "
        f"{ELASTIC} {ranks_log} {stop}\n"
    )
    sub = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=job.env, cwd=ROOT, capture_output=True,
        text=True, timeout=30,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    try:
        wait_for(
            lambda: len(ranks_log.read_text().splitlines()) >= 2,
            JOB_TIMEOUT,
            what=f"both ranks of job {job_id} (state {cluster.job_state(job_id)})",
        )
        # From outside the job, as from a login node: a step that overlaps the running one.
        ls = srun(job, "--overlap", f"--jobid={job_id}", "-N1", *TUILAUNCH, "ls", timeout=120)
        assert ls.returncode == 0, ls.stderr
        header, *rows = ls.stdout.splitlines()
        assert "SLURM JOB" in header
        live = [r for r in rows if r.startswith("live") and f" {job_id} " in r]
        assert live, ls.stdout
        # The dashboard over one node's run, through srun --pty (the README's attach line;
        # two nodes share this host, so the run is named by its pid), left with q.
        pid = live[0].split()[4]
        screen = attach_through_srun(job, job_id, pid)
        assert f"slurm job {job_id}" in screen and "RUNNING" in screen, screen[-3000:]
    finally:
        stop.touch()
    wait_for(
        lambda: cluster.job_state(job_id) not in ("PENDING", "RUNNING", "COMPLETING"),
        JOB_TIMEOUT,
        what=f"job {job_id} to end",
    )
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert cluster.job_state(job_id) == "COMPLETED", output[-4000:]
    # Each rank: RANK WORLD_SIZE RESTART GROUP_RANK PID, in a world of two.
    lines = [ln.split() for ln in ranks_log.read_text().splitlines()]
    assert sorted(int(ln[0]) for ln in lines) == [0, 1] and {ln[1] for ln in lines} == {"2"}
    both = journals(output)
    assert len(both) == 2, output[-4000:]
    nodelist = None
    names = set()
    for events in both:
        started = first(events, "run_started")
        assert started["slurm_job"] == job_id and started["run_id"] == job_id
        assert (started["min_nodes"], started["max_nodes"]) == (2, 2)
        note = next(n for n in started["notes"] if n.startswith("slurm: "))
        names.add(note.split("(", 1)[1].split(")", 1)[0])  # node K of 2 (NAME)
        nodelist = nodelist or started["endpoint"]
        assert started["endpoint"] == nodelist  # one store for both nodes
        assert first(events, "rendezvous_completed")["group_world_size"] == 2
        assert first(events, "run_finished")["exit_code"] == 0
    # Both slurmd ran a node; the store was on the first host of the job's node list, at the
    # job's port.
    assert names == set(cluster.nodes)
    hosts = expand_hostlist(cluster.job_field(job_id, "NodeList"))
    assert sorted(hosts) == sorted(cluster.nodes)
    assert nodelist == f"{hosts[0]}:{rendezvous_port(job_id)}"
    assert "Traceback" not in output
