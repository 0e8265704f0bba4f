"""A real Slurm on this machine for the tests: munged, slurmctld and one or two slurmd.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them). Everything lives in a
temporary directory: the munge key and socket, ``slurm.conf``, the state and spool
directories, the logs; the ports are free ones from the OS, the first job id is drawn at
random (the rendezvous port tuilaunch derives from a job id then differs between clusters
started side by side). Two nodes on one host take two slurmd with their own ports, which
needs a Slurm built with ``--enable-multiple-slurmd`` (Debian's is): the node names are this
host's short name and ``localhost``, both of which resolve here, as node names do on a real
cluster. The cluster is ready when ``sinfo`` shows every node idle; :meth:`SlurmCluster.stop`
cancels what still runs and stops the daemons.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import free_port

DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scontrol")
READY_TIMEOUT = 30.0


class ClusterUnavailable(Exception):
    """The daemons cannot run here; the message says why (the tests skip with it)."""


def _which(tool: str) -> str | None:
    # The daemons live in /usr/sbin, which a user's PATH may lack.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(tool, path=path)


def _tool(name: str) -> str:
    return _which(name) or name


def missing_tools() -> list[str]:
    """The Slurm and munge programs this machine lacks."""
    return [t for t in DAEMONS if _which(t) is None]


def second_node_name() -> tuple[str | None, str]:
    """This host's short name when it can be a second node's name (it resolves and is not
    ``localhost``), and why not otherwise."""
    short = socket.gethostname().split(".")[0]
    if not short or short == "localhost":
        return None, f"this host's name is {short!r}: no second node name that resolves here"
    try:
        socket.getaddrinfo(short, None)
    except OSError as e:
        return None, f"this host's name {short!r} does not resolve ({e}): no second node name"
    return short, ""


@dataclass
class SlurmCluster:
    """A running Slurm: its directory, configuration, node names and daemons."""

    root: Path
    nodes: list[str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    single_reason: str = ""  # why there is only one node, when there is
    started_in: float = 0.0  # seconds from the first daemon to every node idle

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with this cluster's ``SLURM_CONF``."""
        env = {k: v for k, v in (base or os.environ).items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (sinfo, scontrol, squeue, scancel) against this cluster."""
        return subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` says it (empty while slurmctld does not answer)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
        if out.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)

    def log_tail(self, name: str, lines: int = 5) -> str:
        path = self.root / "log" / name
        try:
            return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def job_field(self, job_id: str, name: str) -> str:
        """A field of ``scontrol show job`` (JobState, NodeList...), or "" if not said."""
        out = self.run("scontrol", "-o", "show", "job", job_id)
        for word in out.stdout.split():
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
        return ""

    def job_state(self, job_id: str) -> str:
        """A job's state (COMPLETED, FAILED, RUNNING...)."""
        return self.job_field(job_id, "JobState")

    def stop(self) -> None:
        """Cancel every job, wait for them to end, stop the daemons (slurmd first)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.run("scancel", "--full", "--state=RUNNING", "-u", _user())
                self.run("scancel", "-u", _user())
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    out = self.run("squeue", "-h", "-o", "%i")
                    if out.returncode != 0 or not out.stdout.strip():
                        break
                    time.sleep(0.2)
        order = sorted(self.procs, key=lambda n: (n == "munged", n == "slurmctld"))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


# Loaded here, not in the forked child: between fork and exec only the call itself runs.
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # In the daemon, before exec: SIGTERM when the test process dies, however it dies (a
    # killed pytest must not leave a slurmctld behind).
    _LIBC.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _conf_text(root: Path, nodes: list[str], ctld_port: int, node_ports: list[int]) -> str:
    user = _user()
    lines = [
        "ClusterName=tltest",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'sock'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        f"PlugStackConfig={root / 'plugstack.conf'}",
        # No cgroups: process tracking by /proc, no task binding, nothing to account.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        # The node's size as written here, whatever this machine has (a CI runner's count).
        "SlurmdParameters=config_overrides",
        "KillWait=3",
        # A loaded test machine (2 cores, several suites) answers slowly: no RPC timeouts.
        "MessageTimeout=60",
        "InactiveLimit=0",
        f"FirstJobId={random.randint(1000, 9_000_000)}",
    ]
    for name, port in zip(nodes, node_ports, strict=True):
        # NodeHostname: a name no node has, so that two node names may share this host
        # (slurmctld refuses a node name that is another node's host name).
        lines.append(
            f"NodeName={name} NodeHostname=tl-slurm-host NodeAddr=127.0.0.1 Port={port} CPUs=4"
        )
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP")
    return "\n".join(lines) + "\n"


def _start_once(root: Path, nodes: list[str]) -> SlurmCluster:
    for sub in ("munge", "state", "spool", "run", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o755)  # munged wants its socket's directory open to all
    (root / "plugstack.conf").write_text("")
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ctld_port = free_port()
    node_ports = [free_port() for _ in nodes]
    (root / "slurm.conf").write_text(_conf_text(root, nodes, ctld_port, node_ports))
    cluster = SlurmCluster(root=root, nodes=list(nodes))
    t0 = time.monotonic()
    logs = root / "log"

    def start(name: str, argv: list[str]) -> None:
        out = open(logs / f"{name}.out", "wb")  # noqa: SIM115 (kept open for the daemon)
        cluster.procs[name] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=cluster.env(),
            preexec_fn=_die_with_parent,
        )
        out.close()

    try:
        # --force: pytest's temporary directories are 0700, which munged would refuse for
        # its socket; only this user (root) talks to it.
        start(
            "munged",
            [
                _tool("munged"),
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={root / 'munge' / 'sock'}",
                f"--pid-file={root / 'run' / 'munged.pid'}",
                f"--log-file={logs / 'munged.log'}",
                f"--seed-file={root / 'munge' / 'seed'}",
            ],
        )
        _wait_munge(cluster, root)
        start("slurmctld", [_tool("slurmctld"), "-D", "-i", "-f", str(cluster.conf)])
        for name in nodes:
            argv = [_tool("slurmd"), "-D", "-f", str(cluster.conf), "-N", name]
            start(f"slurmd-{name}", argv)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
            if dead:
                name = dead[0]
                raise ClusterUnavailable(
                    f"{name} exited ({cluster.procs[name].returncode}): {_last_words(logs, name)}"
                )
            states = cluster.states()
            if len(states) == len(nodes) and all(s == "idle" for s in states.values()):
                break
            if time.monotonic() > deadline:
                seen = states or "sinfo got no answer"
                raise ClusterUnavailable(
                    f"the nodes were not idle after {READY_TIMEOUT:.0f}s ({seen}): "
                    f"{cluster.log_tail('slurmctld.log')}"
                )
            time.sleep(0.1)
    except BaseException:
        cluster.stop()
        raise
    cluster.started_in = time.monotonic() - t0
    return cluster


def _wait_munge(cluster: SlurmCluster, root: Path) -> None:
    sock = root / "munge" / "sock"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        proc = cluster.procs["munged"]
        if proc.poll() is not None:
            raise ClusterUnavailable(f"munged exited: {_last_words(root / 'log', 'munged')}")
        if sock.exists():
            probe = subprocess.run(["munge", "-n", "-S", str(sock)], capture_output=True)
            if probe.returncode == 0:
                return
        time.sleep(0.05)
    raise ClusterUnavailable("munged did not answer in 10s")


def _last_words(logs: Path, name: str) -> str:
    texts = []
    for path in (logs / f"{name}.out", logs / f"{name}.log"):
        with contextlib.suppress(OSError):
            texts += [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    fatal = [ln for ln in texts if "fatal" in ln.lower() or "error" in ln.lower()]
    return " | ".join((fatal or texts)[-3:]) or "(nothing logged)"


def start_cluster(root: Path) -> SlurmCluster:
    """Start a Slurm under ``root``: two nodes when this host allows it, else one.

    Raises :class:`ClusterUnavailable` with the reason when none can start.
    """
    missing = missing_tools()
    if missing:
        raise ClusterUnavailable(
            f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd "
            "slurm-client munge)"
        )
    if os.geteuid() != 0:
        raise ClusterUnavailable(
            "the tests start slurmd, which launches jobs as their user: it needs root"
        )
    short, why = second_node_name()
    if short is not None:
        try:
            return _start_once(root / "two", [short, "localhost"])
        except ClusterUnavailable as e:
            why = f"two slurmd on one host did not start ({e})"
    cluster = _start_once(root / "one", [short or "localhost"])
    cluster.single_reason = why
    return cluster
