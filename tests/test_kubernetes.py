"""tuilaunch as a Kubernetes pod runs it: configured by ``PET_*`` variables, no terminal.

A PyTorchJob (elastic, c10d) or a TrainJob (static: node rank and master address) pod runs
``tuilaunch train.py`` with torchrun's options in ``PET_*`` variables, stdin not a terminal,
no ``TERM``, stdout and stderr read by the container runtime for ``kubectl logs``. Here each
"pod" is a real launcher on this machine with such an environment (built from nothing, as
``env -i`` would: PATH, HOME, HOSTNAME, the service variables, ``PET_*``), and two of them
form one job. The output must arrive while the job runs (a log read only at the end is no log),
hold no terminal escapes, and the journal must show the ``PET_*`` values taken.
"""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PY, ROOT, WORKERS, free_port, journal_path, read_journal, wait_for, wait_gone

pytestmark = pytest.mark.slow

POD = str(WORKERS / "pod.py")
CRASH = str(WORKERS / "crash.py")
NOOP = str(WORKERS / "noop.py")


class Pod:
    """A launcher started with a pod's environment; its stdout and stderr read as they come."""

    def __init__(self, home: Path, name: str, argv: list[str], **pet: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "tmp").mkdir(exist_ok=True)
        self.home = home
        self.token = os.urandom(8).hex()
        self.env = {
            "PATH": f"{Path(PY).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "HOSTNAME": name,
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
            "TMPDIR": str(home / "tmp"),
            "TUILAUNCH_TEST_TOKEN": self.token,
            **pet,
        }
        self.proc = subprocess.Popen(
            [PY, "-m", "tui_launch", *argv],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.out = bytearray()
        self.err = bytearray()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, into: bytearray) -> None:
        # As the container runtime does: whatever the pipe has, as soon as it has it.
        while chunk := os.read(stream.fileno(), 65536):
            into += chunk

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        for r in self._readers:
            r.join(10)
        return code

    @property
    def stdout(self) -> str:
        return self.out.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    made: list[Pod] = []
    yield made
    for p in made:
        p.kill()
    for p in made:
        left = wait_gone(p.token, 15)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind by a pod: {left}"


def two_pods(pods: list[Pod], tmp_path: Path, pet: dict[str, dict[str, str]]) -> list[Pod]:
    stop = tmp_path / "stop"
    for name, env in pet.items():
        pods.append(Pod(tmp_path / name, name, [POD, str(stop)], **env))
    # Every rank says it is ready on stdout while the job runs: the launcher passes worker
    # lines on at once (kubectl logs -f shows them), not at its end.
    for p in pods:
        wait_for(
            lambda p=p: " of 2 ready on group rank " in p.stdout,
            120,
            what=f"a rank's ready line on {p.env['HOSTNAME']}'s stdout; stderr: {p.stderr[-2000:]}",
        )
        assert p.proc.poll() is None
        assert "[tuilaunch] attempt 0: started rank" in p.stderr  # its own lines too, live
    stop.touch()
    for p in pods:
        assert p.wait() == 0, p.stderr[-4000:]
    return pods


def check_pod_output(p: Pod) -> list[dict]:
    """What every pod's log must be: headless by itself, no escapes, a journal."""
    assert "stdout or stdin is not a terminal: running headless" in p.stderr
    assert "\x1b" not in p.stdout + p.stderr, "a terminal escape in a container log"
    assert "Traceback" not in p.stderr
    # No XDG_RUNTIME_DIR in a pod: the run index is under $HOME.
    assert list((p.home / ".local" / "state" / "tuilaunch").glob("*.json"))
    return read_journal(journal_path(p.stderr))


def started(events: list[dict]) -> dict:
    return next(e for e in events if e["kind"] == "run_started")


def test_pytorchjob_pods_c10d(pods: list[Pod], tmp_path: Path):
    """PyTorchJob with an elasticPolicy: PET_RDZV_BACKEND/ENDPOINT/ID, PET_NNODES,
    PET_NPROC_PER_NODE, PET_MAX_RESTARTS; the command line is only the script."""
    port = free_port()
    pet = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "PET_RDZV_ID": "pytorchjob-demo",
        "PET_MAX_RESTARTS": "2",
    }
    done = two_pods(pods, tmp_path, {"demo-worker-0": pet, "demo-worker-1": pet})
    ranks = set()
    for p in done:
        run = started(check_pod_output(p))
        assert (run["min_nodes"], run["max_nodes"], run["nproc_per_node"]) == (2, 2, 1)
        assert (run["backend"], run["endpoint"]) == ("c10d", f"127.0.0.1:{port}")
        assert (run["run_id"], run["max_restarts"]) == ("pytorchjob-demo", 2)
        assert run["slurm_job"] is None
        ranks |= {ln.split()[1] for ln in p.stdout.splitlines() if " ready on " in ln}
    assert ranks == {"0", "1"}


def test_trainjob_pods_static(pods: list[Pod], tmp_path: Path):
    """Kubeflow Trainer's TrainJob: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK and
    PET_MASTER_ADDR/PORT (the static rendezvous); each pod's node rank is its group rank."""
    port = free_port()
    common = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }
    done = two_pods(
        pods,
        tmp_path,
        {
            "trainjob-node-0-0": {**common, "PET_NODE_RANK": "0"},
            "trainjob-node-0-1": {**common, "PET_NODE_RANK": "1"},
        },
    )
    for node_rank, p in enumerate(done):
        events = check_pod_output(p)
        run = started(events)
        assert (run["min_nodes"], run["max_nodes"], run["backend"]) == (2, 2, "static")
        assert run["endpoint"] == f"127.0.0.1:{port}"
        done_rdzv = next(e for e in events if e["kind"] == "rendezvous_completed")
        assert done_rdzv["group_rank"] == node_rank
        assert f"ready on group rank {node_rank}" in p.stdout


def test_failed_pod_exit_code_is_the_summary_one(pods: list[Pod], tmp_path: Path):
    """A failing job's pod: the exit status the container reports (what a podFailurePolicy
    reads) is the one the summary prints, and the root cause is in the log."""
    pet = {"PET_NPROC_PER_NODE": "2", "PET_STANDALONE": "1"}
    pod = Pod(tmp_path / "p", "fail-0", [CRASH, "--rank", "1", "--mode", "exit"], **pet)
    pods.append(pod)
    code = pod.wait()
    assert code != 0
    check_pod_output(pod)
    assert f"exit code {code}" in pod.stderr
    assert "rank 1" in pod.stderr


def test_terminal_without_term_runs_headless(pods: list[Pod], tmp_path: Path):
    """A terminal nobody named (TERM unset: ``kubectl exec -t`` into a minimal image, a
    container with ``tty: true``) gets the headless output, not the dashboard's escapes."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    token = os.urandom(8).hex()
    env = {
        "PATH": f"{Path(PY).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "TUILAUNCH_TEST_TOKEN": token,
    }
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "tui_launch", "--standalone", "--nproc-per-node", "1", NOOP],
        cwd=ROOT,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
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
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(5)
        os.close(master)
        assert not wait_gone(token, 15)
    text = err.decode("utf-8", "replace")
    assert proc.returncode == 0, text[-3000:]
    assert "TERM is not set: running headless (as --no-tui)" in text
    assert "\x1b[?1049h" not in shown.decode("utf-8", "replace")  # no alternate screen
