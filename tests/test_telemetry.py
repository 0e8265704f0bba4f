"""GPU and process telemetry: the sampler against the fake NVML, psutil against real processes,
the store's view, and the real launcher run against the fake NVML.

No GPU exists here, so NVML is the fake (``tui_launch.core.telemetry.fake_nvml``, the same surface
as
nvidia-ml-py, checked below against the installed module). Everything else is real: rank
processes are real processes (their pids are what the fake reports or hides), psutil reads
them, and the launcher tests run ``python -m tui_launch`` with real torch workers.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, WORKERS, base_env, read_journal, tuilaunch_cmd
from rich.console import Console

from tui_launch.core import telemetry as tm
from tui_launch.core.model.events import (
    Notice,
    TelemetryRecord,
    TelemetrySample,
    TelemetryTotals,
    from_dict,
    to_dict,
)
from tui_launch.core.model.store import RunStore, replay
from tui_launch.core.telemetry import fake_nvml as fake
from tui_launch.core.telemetry import nvml as nvml_module

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _fresh_fake() -> Iterator[None]:
    fake.configure(1)
    yield
    fake.configure(1)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Real processes standing in for ranks; killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        with contextlib.suppress(OSError):
            p.kill()
        p.wait(5)


def spawn(procs: list[subprocess.Popen[bytes]], n: int, **env: str) -> list[int]:
    """Start ``n`` sleeping processes, rank i with LOCAL_RANK=i and ``env``.

    ``Popen`` returns once the child has exec'd, so ``/proc/<pid>/environ`` is already the
    new program's; it returns once every one is asleep (state ``S``), as a rank waiting on
    work would be.
    """
    for i in range(n):
        e = {**os.environ, "LOCAL_RANK": str(i), **env}
        procs.append(subprocess.Popen(["sleep", "60"], env=e))
    pids = [p.pid for p in procs[-n:]]
    wait_until(lambda: all(proc_state(p) == "S" for p in pids), 30, "the sleepers to sleep")
    return pids


def exited_unreaped(cmd: list[str]) -> subprocess.Popen[bytes]:
    """Start ``cmd`` and return once it has exited but is not reaped yet: a zombie."""
    p = subprocess.Popen(cmd)
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # waits for the exit, reaps nothing
    return p


def proc_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", "rb") as fp:
        return fp.read().rsplit(b")", 1)[1].split()[0].decode()


def tree_cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime of ``pids`` read straight from ``/proc`` (an independent reader)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            f = fp.read().rsplit(b")", 1)[1].split()
        total += int(f[11]) + int(f[12])
    return total / os.sysconf("SC_CLK_TCK")


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def telemetry(**kw: object) -> tuple[tm.Telemetry, RunStore]:
    store = RunStore()
    kw.setdefault("nvml", fake)
    t = tm.Telemetry(store.post, **kw)  # type: ignore[arg-type]
    t.open()
    return t, store


def targets(pids: list[int]) -> list[tm.RankTarget]:
    return [tm.RankTarget(local_rank=i, global_rank=i, pid=p) for i, p in enumerate(pids)]


# ----------------------------------------------------------------- the fake's surface


def test_fake_has_the_real_modules_surface() -> None:
    """Every function, error class and constant the fake has exists in nvidia-ml-py, with the
    same parameters; the error hierarchy behaves the same way."""
    import pynvml as real

    for name in dir(fake):
        if name.startswith("nvml") and callable(getattr(fake, name)) and name[4].isupper():
            assert hasattr(real, name), name
            ours = list(inspect.signature(getattr(fake, name)).parameters)
            theirs = list(inspect.signature(getattr(real, name)).parameters)
            assert ours == theirs, (name, ours, theirs)
        if name.startswith(("NVML_", "NVMLError_")):
            assert hasattr(real, name), name
        if name.startswith("NVML_"):
            assert getattr(fake, name) == getattr(real, name), name
    for struct in ("c_nvmlMemory_t", "c_nvmlUtilization_t", "c_nvmlProcessUtilizationSample_t"):
        assert [f[0] for f in getattr(fake, struct)._fields_] == [
            f[0] for f in getattr(real, struct)._fields_
        ], struct
    # NVMLError(code) is the code's subclass in both.
    for mod in (fake, real):
        e = mod.NVMLError(mod.NVML_ERROR_GPU_IS_LOST)
        assert isinstance(e, mod.NVMLError_GpuIsLost) and e.value == 15
        assert str(e) == "GPU is lost"
    # Every NVML call the sampler makes is one the fake has.
    src = inspect.getsource(nvml_module)  # the one module that calls NVML
    called = set(re.findall(r'"(nvml(?:Device|System)Get[A-Z]\w+)"', src))
    assert "nvmlDeviceGetComputeRunningProcesses" in called  # the pattern finds the calls
    for name in called | {"nvmlInit", "nvmlShutdown"}:
        assert hasattr(fake, name) and hasattr(real, name), name


# ----------------------------------------------------------------- GPU sampler scenarios


def test_zero_gpus_is_a_state() -> None:
    fake.configure(0)
    g = tm.GpuSampler(fake)
    g.open()
    assert g.state == tm.GPU_NO_DEVICES
    assert "no devices" in g.note
    assert g.sample() == ((), {})


def test_one_gpu_readings_and_slow_fields() -> None:
    fake.configure(1, processes={0: [(4321, 3 * GIB)]})
    g = tm.GpuSampler(fake, slow_every=5)
    g.open()
    assert g.state == tm.GPU_OK and g.simulated
    for _ in range(6):
        gpus, procs = g.sample()
    (r,) = gpus
    assert r.index == 0 and r.name == "NVIDIA H100 80GB HBM3" and r.uuid == fake.gpu_uuid(0)
    assert r.util is not None and 0 <= r.util <= 100
    assert r.mem_total == 80 * GIB and r.mem_used == 3 * GIB + 512 * MIB
    assert r.temp is not None and r.power is not None and r.power_limit == 700.0
    # Temperature and power are slow fields: ticks 1 and 6 of 6.
    assert fake.calls["nvmlDeviceGetTemperature"] == 2
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 6
    assert fake.calls["nvmlInit"] == 1  # one nvmlInit for the sampler's whole life
    (p,) = procs[4321]
    assert p.gpu == 0 and p.mem == 3 * GIB and p.sm is not None
    g.close()
    assert fake.calls["nvmlShutdown"] == 1


def test_eight_gpus_pids_match_ranks(sleepers: list[subprocess.Popen[bytes]]) -> None:
    """Each rank's pid is in NVML's list of GPU (7 - rank): mapped by pid, memory its own."""
    pids = spawn(sleepers, 8)
    fake.configure(8, processes={7 - i: [(pid, (i + 1) * GIB)] for i, pid in enumerate(pids)})
    t, store = telemetry()
    t.set_workers(0, targets(pids))
    t.tick()
    s = t.tick()
    assert s.gpu_state == "ok" and len(s.gpus) == 8 and s.simulated
    for i, r in enumerate(s.ranks):
        assert r.mapping == "pid" and r.gpus == (7 - i,)
        assert r.gpu_mem == (i + 1) * GIB
        assert r.gpu_util is not None
        assert r.rss and r.rss > 0 and r.status in ("sleeping", "running")
        assert r.cpu is not None and r.cpu < 50  # `sleep` does not spin
    view = store.snapshot().telemetry
    assert view is not None and view.rank(3, attempt=0) == s.ranks[3]
    assert len(view.gpu_util) == 8 and all(len(h) == 2 for h in view.gpu_util)


def test_a_ranks_gpu_memory_is_summed_over_its_process_tree(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """A data-loader-like child's GPU memory belongs to its rank."""
    parent = subprocess.Popen(
        ["sh", "-c", "sleep 60 & sleep 60 & wait"], env={**os.environ, "LOCAL_RANK": "0"}
    )
    sleepers.append(parent)
    deadline = time.monotonic() + 5
    kids: list[int] = []
    while time.monotonic() < deadline and len(kids) < 2:
        with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as fp:
            kids = [int(c) for c in fp.read().split()]
        time.sleep(0.02)
    assert len(kids) == 2
    fake.configure(1, processes={0: [(kids[0], 2 * GIB), (kids[1], 3 * GIB)]})
    t, _ = telemetry()
    t.set_workers(0, targets([parent.pid]))
    (r,) = t.tick().ranks
    assert r.procs == 3 and r.mapping == "pid" and r.gpus == (0,)
    assert r.gpu_mem == 5 * GIB
    for k in kids:
        os.kill(k, signal.SIGKILL)


def test_namespace_mismatch_falls_back_to_local_rank_and_uuids(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """NVML lists pids of another namespace: ranks are mapped through their own
    CUDA_VISIBLE_DEVICES (GPU UUIDs, in reverse order) and LOCAL_RANK, marked inferred."""
    cvd = ",".join(fake.gpu_uuid(i) for i in reversed(range(4)))
    pids = spawn(sleepers, 4, CUDA_VISIBLE_DEVICES=cvd)
    on_gpus = {3 - i: [(p, GIB)] for i, p in enumerate(pids)}
    fake.configure(4, pid_offset=fake.PID_OFFSET, processes=on_gpus)
    t, store = telemetry(launcher_cvd="0,1,2,3")  # the worker's own environment wins
    t.set_workers(0, targets(pids))
    s = t.tick()
    for i, r in enumerate(s.ranks):
        assert r.mapping == "inferred", r
        assert r.gpus == (3 - i,)
        g = s.gpus[3 - i]
        assert r.gpu_mem == g.mem_used and r.gpu_util == g.util  # whole-device figures
    totals = store.snapshot().telemetry.totals  # type: ignore[union-attr]
    assert {t.mapping for t in totals} == {"inferred"}


def test_no_inference_when_nvml_shows_no_foreign_processes(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """A CPU job on a GPU machine: nothing on the GPUs, so no GPU is guessed for any rank."""
    pids = spawn(sleepers, 2)
    fake.configure(2, processes={})
    t, _ = telemetry()
    t.set_workers(0, targets(pids))
    for r in t.tick().ranks:
        assert r.gpus == () and r.mapping is None and r.gpu_mem is None


def test_visible_device_forms() -> None:
    idx = {fake.gpu_uuid(i): i for i in range(4)}
    idx[fake.mig_uuid(2, 0)] = 2
    assert tm.visible_device(None, 1, idx, 4) == 1
    assert tm.visible_device(None, 5, idx, 4) is None
    assert tm.visible_device("3,2", 0, idx, 4) == 3
    assert tm.visible_device("3,2", 1, idx, 4) == 2
    assert tm.visible_device("3,2", 2, idx, 4) is None
    assert tm.visible_device("2", 3, idx, 4) == 2  # one device per rank, set by a wrapper
    assert tm.visible_device("", 0, idx, 4) is None  # CUDA_VISIBLE_DEVICES="" hides all
    assert tm.visible_device(f"{fake.gpu_uuid(1)},{fake.gpu_uuid(0)}", 0, idx, 4) == 1
    assert tm.visible_device(fake.gpu_uuid(3)[:28], 0, idx, 4) == 3  # a unique prefix
    assert tm.visible_device("GPU-fa4e", 0, idx, 4) is None  # ambiguous prefix
    assert tm.visible_device(fake.mig_uuid(2, 0), 0, idx, 4) == 2


def test_mig_uuids_map_to_their_gpu() -> None:
    fake.configure(2, mig=True)
    g = tm.GpuSampler(fake)
    g.open()
    assert g.uuid_index[fake.mig_uuid(1, 1)] == 1
    assert g.uuid_index[fake.gpu_uuid(0)] == 0


def test_nvml_lost_mid_run(sleepers: list[subprocess.Popen[bytes]]) -> None:
    """Every GPU lost after 2 ticks: the state says so, one notice, ticks go on."""
    pids = spawn(sleepers, 2)
    fake.configure(2, lose_after=2, processes={i: [(p, GIB)] for i, p in enumerate(pids)})
    t, store = telemetry()
    t.set_workers(0, targets(pids))
    first = t.tick()
    assert first.gpu_state == "ok" and first.ranks[0].mapping == "pid"
    states = [t.tick().gpu_state for _ in range(4)]
    assert states[-1] == "lost"
    last = store.snapshot().telemetry.latest  # type: ignore[union-attr]
    assert "lost mid-run" in last.gpu_note
    assert [g.state for g in last.gpus] == ["lost", "lost"]
    assert all(r.rss for r in last.ranks)  # process telemetry goes on
    notices = [e for e in store.events() if isinstance(e, Notice)]
    assert len(notices) == 1 and "lost" in notices[0].message
    calls = sum(fake.calls.values())
    t.tick()
    assert sum(fake.calls.values()) == calls  # a lost NVML is not asked again


def test_one_gpu_lost_the_others_go_on() -> None:
    fake.configure(3, lose_after=1, lost_gpus={1})
    g = tm.GpuSampler(fake)
    g.open()
    for _ in range(3):
        gpus, _ = g.sample()
    assert g.state == "ok"
    assert [x.state for x in gpus] == ["ok", "lost", "ok"]
    assert gpus[0].util is not None and gpus[1].util is None
    assert "lost: GPU 1" in g.note


def test_not_supported_fields(sleepers: list[subprocess.Popen[bytes]]) -> None:
    """Temperature, power and per-process utilisation not supported: None, asked once; the
    rank's utilisation falls back to its GPU's, which it has alone."""
    (pid,) = spawn(sleepers, 1)
    fake.configure(
        1,
        unsupported={*fake.SLOW_FIELDS, "nvmlDeviceGetProcessUtilization"},
        processes={0: [(pid, GIB)]},
    )
    t, _ = telemetry(slow_every=1)
    t.set_workers(0, targets([pid]))
    for _ in range(3):
        s = t.tick()
    (g,) = s.gpus
    assert g.temp is None and g.power is None and g.util is not None
    assert fake.calls["nvmlDeviceGetTemperature"] == 1
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 1
    (r,) = s.ranks
    assert r.mapping == "pid" and r.gpu_mem == GIB and r.gpu_util == g.util


@pytest.mark.parametrize(
    ("spec", "state", "words"),
    [
        ("nolib", "no-library", "libnvidia-ml"),
        ("nodriver", "no-driver", "driver"),
        ("noperm", "permission", "permission"),
        ("0", "no-devices", "no devices"),
    ],
)
def test_init_failures_from_env(
    monkeypatch: pytest.MonkeyPatch, spec: str, state: str, words: str
) -> None:
    monkeypatch.setenv(tm.FAKE_ENV, spec)
    g = tm.GpuSampler()
    g.open()
    assert g.state == state and words in g.note
    assert g.sample() == ((), {})
    g.close()


def test_the_caller_chooses_the_fake_and_the_env_hook_overrides_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``load_nvml`` opens what its caller says (the demo: ``GpuSampler(fake="2")``); the
    tests' ``TUILAUNCH_FAKE_NVML`` hook overrides that choice, and nothing else reads it."""
    monkeypatch.delenv(tm.FAKE_ENV, raising=False)
    assert tm.load_nvml("2") == (fake, "")
    assert tm.load_nvml("bogus")[0] is None and "unknown scenario" in tm.load_nvml("bogus")[1]
    g = tm.GpuSampler(fake="2")
    g.open()
    assert g.state == tm.GPU_OK and g.simulated and len(g.gpus) == 2
    g.close()
    monkeypatch.setenv(tm.FAKE_ENV, "0")
    assert tm.fake_from_env("2") == "0" and tm.fake_from_env() == "0"
    g = tm.GpuSampler(fake="2")
    g.open()
    assert g.state == tm.GPU_NO_DEVICES
    readers = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tui_launch").rglob("*.py"))
        if "FAKE_ENV" in path.read_text() or "TUILAUNCH_FAKE_NVML" in path.read_text()
    ]
    assert readers == [
        "tui_launch/core/telemetry/__init__.py",  # the re-export
        "tui_launch/core/telemetry/fake_nvml.py",  # its docstring and error messages
        "tui_launch/core/telemetry/nvml.py",  # fake_from_env
    ]


def test_real_nvidia_ml_py_without_a_driver() -> None:
    """The real module on this GPU-less machine: no libnvidia-ml, a state, no exception."""
    import pynvml

    g = tm.GpuSampler(pynvml)
    g.open()
    if g.state == tm.GPU_OK:  # pragma: no cover - only on a machine with a GPU
        pytest.skip("this machine has a working NVML")
    assert g.state in ("no-library", "no-driver", "no-devices")
    assert g.note.startswith(("no GPU telemetry", "no GPUs"))


def test_nvml_module_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tm.FAKE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    g = tm.GpuSampler()
    g.open()
    assert g.state == "no-library" and "nvidia-ml-py" in g.note


def test_process_list_permission_denied_allows_inference(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    pids = spawn(sleepers, 2)
    fake.configure(2, proc_error=fake.NVML_ERROR_NO_PERMISSION)
    t, _ = telemetry()
    t.set_workers(0, targets(pids))
    s = t.tick()
    assert "no permission for process lists" in s.gpu_note
    assert [r.gpus for r in s.ranks] == [(0,), (1,)]
    assert {r.mapping for r in s.ranks} == {"inferred"}


def test_gpu_off_and_a_broken_module_never_raise(sleepers: list[subprocess.Popen[bytes]]) -> None:
    pids = spawn(sleepers, 1)
    t, _ = telemetry(gpu=False)
    t.set_workers(0, targets(pids))
    s = t.tick()
    assert s.gpu_state == "off" and s.gpus == () and s.ranks[0].rss

    class Broken:
        def __getattr__(self, name: str) -> object:
            def fail(*a: object) -> None:
                raise RuntimeError(f"{name} exploded")

            return fail

    t2, _ = telemetry(nvml=Broken())
    t2.set_workers(0, targets(pids))
    s2 = t2.tick()
    assert s2.gpu_state == "error" and "exploded" in s2.gpu_note


def test_gone_rank_gives_empty_readings() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    t, _ = telemetry()
    t.set_workers(0, targets([p.pid]))
    (r,) = t.tick().ranks
    assert r.cpu is None and r.rss is None and r.status is None


# ----------------------------------------------------------------- psutil against a real hog


@pytest.mark.slow
def test_process_figures_of_a_real_worker(tmp_path: Path) -> None:
    """A worker holding 200 MiB (and a child holding 50 MiB) and spinning half a CPU."""
    ready = tmp_path / "ready"
    hog = subprocess.Popen(
        [sys.executable, str(WORKERS / "hog.py"), "--mb", "200", "--child-mb", "50",
         "--duty", "0.5", "--seconds", "30", "--ready", str(ready)],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        ps = tm.ProcessSampler()
        pids = ps.sample([hog.pid])[hog.pid].pids
        assert len(pids) == 2  # the rank and its child
        # Bracket each sample with independent /proc reads (time, CPU seconds): whatever the
        # load on this machine, the sampler's CPU % lies between what the brackets allow.
        t_a1, c_a1 = time.monotonic(), tree_cpu_seconds(pids)
        ps.sample([hog.pid])
        t_b1, c_b1 = time.monotonic(), tree_cpu_seconds(pids)
        # Half a core asked for; however starved, wait until it has had 0.2 s of CPU.
        wait_until(lambda: tree_cpu_seconds(pids) - c_b1 >= 0.2, 60, "the hog to use CPU")
        t_a2, c_a2 = time.monotonic(), tree_cpu_seconds(pids)
        tree = ps.sample([hog.pid])[hog.pid]
        t_b2, c_b2 = time.monotonic(), tree_cpu_seconds(pids)
        assert tree.pids == pids
        # RSS: 200 + 50 MiB touched, plus two interpreters (generous bounds).
        assert tree.rss is not None and 250 * MIB <= tree.rss <= 450 * MIB, tree.rss
        # CPU: it did run, no more than the machine's cores, and as /proc says.
        tick = 2 / os.sysconf("SC_CLK_TCK")  # one clock tick of rounding per process
        low = 100 * (c_a2 - c_b1 - tick) / (t_b2 - t_a1)
        high = 100 * (c_b2 - c_a1 + tick) / (t_a2 - t_b1)
        assert tree.cpu is not None and 0 < tree.cpu <= 100 * (os.cpu_count() or 1)
        assert low - 0.1 <= tree.cpu <= high + 0.1, (low, tree.cpu, high)
        assert (
            tree.threads is not None
            and tree.threads >= 2
            and tree.status in ("running", "sleeping")
        )
        # SIGSTOP from outside tuilaunch: psutil's state says stopped.
        os.kill(hog.pid, signal.SIGSTOP)
        wait_until(lambda: proc_state(hog.pid) == "T", 10, "the hog to stop")
        tree = ps.sample([hog.pid])[hog.pid]
        assert tree.status == "stopped"
        os.kill(hog.pid, signal.SIGCONT)
    finally:
        hog.kill()
        hog.wait(10)
        with contextlib.suppress(Exception):
            import psutil

            for c in psutil.Process(hog.pid).children():
                c.kill()


def test_proc_reader_agrees_with_psutil(sleepers: list[subprocess.Popen[bytes]]) -> None:
    """The one-read /proc/<pid>/stat path against psutil (the fallback where there is no
    /proc): same state, threads, RSS and CPU seconds for a live and a stopped process."""
    (pid,) = spawn(sleepers, 1)
    ps = tm.ProcessSampler()
    for stopped in (False, True):
        if stopped:
            os.kill(pid, signal.SIGSTOP)
            wait_until(lambda: proc_state(pid) == "T", 10, "the process to stop")
        try:
            fast, slow = ps._read_proc(pid), ps._read_psutil(pid)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert fast is not None and slow is not None
        assert fast[0] == slow[0] == ("stopped" if stopped else "sleeping")
        assert fast[3] == slow[3] >= 1  # threads
        assert abs(fast[2] - slow[2]) <= 256 * 1024  # RSS, read a moment apart
        assert abs(fast[1] - slow[1]) <= 0.05  # CPU seconds
    assert ps._read_proc(2**22 + 1) is None and ps._read_psutil(2**22 + 1) is None
    z = exited_unreaped(["true"])
    try:
        assert ps._read_proc(z.pid)[0] == ps._read_psutil(z.pid)[0] == "zombie"  # type: ignore[index]
    finally:
        z.wait()


def test_proc_files_stay_open_while_their_process_lives(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """Each process's ``/proc`` files are opened once and read again at every tick (opening
    them was most of a tick), and closed when the process is gone: no descriptor leaks as
    ranks come and go, and a pid reused later is read afresh."""
    pids = spawn(sleepers, 2)
    fds_before = len(os.listdir("/proc/self/fd"))
    ps = tm.ProcessSampler()
    ps.sample(pids)  # the first tick scans every process's parent: no children file read
    first = ps.sample(pids)
    held = len(os.listdir("/proc/self/fd")) - fds_before
    assert held == 4  # stat and children of each of the two
    for _ in range(5):
        again = ps.sample(pids)
    assert len(os.listdir("/proc/self/fd")) - fds_before == 4
    assert {p: r.status for p, r in again.items()} == {p: r.status for p, r in first.items()}
    sleepers[0].kill()
    sleepers[0].wait(5)
    gone = ps.sample(pids)
    assert gone[pids[0]].status is None and gone[pids[1]].status == "sleeping"
    assert len(os.listdir("/proc/self/fd")) - fds_before == 2  # the dead one's are closed
    ps.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_totals_from_the_stores_view_are_the_samplers_own(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """Given the store's view, the sampler does not fold its samples a second time: the totals
    it journals at the end are the store's, and the same as its own fold would have made."""
    pids = spawn(sleepers, 2)
    fake.configure(2, processes={i: [(p, (i + 1) * GIB)] for i, p in enumerate(pids)})
    store = RunStore()
    t = tm.Telemetry(
        store.post, nvml=fake, journal_every=0, view=lambda: store.snapshot().telemetry
    )
    t.open()
    t.set_workers(0, targets(pids))
    own = None
    for _ in range(3):
        own = tm.fold(own, t.tick())
    t.stop()
    assert own is not None
    (totals,) = [e for e in store.events() if isinstance(e, TelemetryTotals)]
    assert totals.totals == own.totals
    assert t.procs is not None and not t.procs._fds  # stopping closed the /proc files
    assert [x.samples for x in totals.totals] == [3, 3]


def test_zombie_rank_is_reported_as_zombie() -> None:
    p = exited_unreaped(["true"])
    try:
        tree = tm.ProcessSampler().sample([p.pid])[p.pid]
        assert tree.status == "zombie" and tree.rss is None
    finally:
        p.wait()


# ----------------------------------------------------------------- store view and journal


def test_journal_rate_and_round_trip(sleepers: list[subprocess.Popen[bytes]]) -> None:
    pids = spawn(sleepers, 2)
    fake.configure(2, processes={i: [(p, (i + 1) * GIB)] for i, p in enumerate(pids)})
    t, store = telemetry(journal_every=3600)
    t.set_workers(0, targets(pids))
    kinds = [type(t.tick()) for _ in range(4)]
    # The first tick is journaled, the next ones (within the hour) are live samples only.
    assert kinds == [TelemetryRecord, TelemetrySample, TelemetrySample, TelemetrySample]
    history = store.events()
    assert sum(isinstance(e, TelemetryRecord) for e in history) == 1
    assert not any(type(e) is TelemetrySample for e in history)
    rec = next(e for e in history if isinstance(e, TelemetryRecord))
    back = from_dict(json.loads(json.dumps(to_dict(rec))))
    assert back == rec
    snap = replay([back])
    assert snap.telemetry is not None and snap.telemetry.totals[1].peak_gpu_mem == 2 * GIB
    t0, _ = telemetry(journal_every=0)
    assert type(t0.tick()) is TelemetrySample


def test_fold_totals_history_and_attempts() -> None:
    from tui_launch.core.model.events import RankReading

    def sample(attempt: int, cpu: float, rss: int, mem: int | None) -> TelemetrySample:
        r = RankReading(
            local_rank=0, global_rank=0, pid=1, cpu=cpu, rss=rss, threads=1,
            status="running", gpus=(0,), mapping="pid", gpu_mem=mem, gpu_util=50,
        )  # fmt: skip
        return TelemetrySample(attempt=attempt, gpu_state="off", gpu_note="", gpus=(), ranks=(r,))

    view = None
    for i in range(tm.HISTORY + 5):
        view = tm.fold(view, sample(0, cpu=float(i % 2) * 100, rss=i * MIB, mem=GIB))
    assert view is not None
    (tot,) = view.totals
    assert tot.peak_rss == (tm.HISTORY + 4) * MIB and tot.mean_cpu == pytest.approx(
        100 * ((tm.HISTORY + 5) // 2) / (tm.HISTORY + 5)
    )
    assert tot.peak_gpu_mem == GIB and tot.mean_gpu_util == 50
    assert len(view.history(0)) == tm.HISTORY
    view = tm.fold(view, sample(1, cpu=10, rss=MIB, mem=None))
    assert [t.attempt for t in view.totals] == [0, 1]
    assert view.history(0) == (10,)  # a new attempt starts a new history
    assert view.rank(0, attempt=0) is None and view.rank(0, attempt=1) is not None


def test_schedule_does_not_drift() -> None:
    """The thread ticks at start + k * interval: never more ticks than grid slots, however
    late a loaded machine runs it (missed ticks are skipped, not bunched)."""
    fake.configure(1)
    store = RunStore()
    starts: list[float] = []
    t = tm.Telemetry(store.post, nvml=fake, interval=0.1, journal_every=0)
    tick = t.tick

    def timed() -> TelemetrySample:
        starts.append(time.monotonic())
        return tick()

    t.tick = timed  # type: ignore[method-assign]
    t0 = time.monotonic()
    t.start()
    wait_until(lambda: len(starts) >= 6, 60, "six ticks")
    t.stop()
    assert not t.running
    n = len(starts)
    assert t.ticks in (n - 1, n)  # each tick posted once; one under way at stop posts nothing
    # Tick k starts at or after t0 + k * 0.1 (t0: before the thread opened NVML), so n ticks
    # need (n - 1) * 0.1 s at least (a millisecond of slack for the timer).
    assert n <= (starts[-1] - t0 + 0.001) / 0.1 + 1, (n, starts[-1] - t0)
    assert t.error is None and t.cpu_seconds >= t.open_cpu_seconds > 0
    # Stopping journals the last reading and the totals; nothing comes after them, not even
    # a tick that was under way when the run ended.
    kinds = [e.kind for e in store.events()]
    assert kinds[-2:] == ["telemetry", "telemetry_totals"]
    version = store.version
    tick()
    t.stop()
    assert store.version == version


# ----------------------------------------------------------------- the real launcher


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    # --verbose: these runs succeed cleanly, and their telemetry tables are in the full summary.
    return subprocess.run(
        tuilaunch_cmd("--verbose", *args), env=env, capture_output=True, text=True, timeout=timeout,
        cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow
def test_launcher_with_fake_gpus_matching_pids(tmp_path: Path) -> None:
    """Two real workers (200 MiB each) on two fake GPUs: the summary and journal show them."""
    journal = tmp_path / "j.jsonl"
    env = base_env(**{tm.FAKE_ENV: "2"})
    p = _run(
        ["--standalone", "--nproc-per-node", "2", "--gpu-interval", "0.5",
         "--journal-samples", "1", "--journal", str(journal), "--log-dir", str(tmp_path / "logs"),
         str(WORKERS / "hog.py"), "--mb", "200", "--duty", "0.3", "--seconds", "4"],
        env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resources (telemetry)" in p.stderr
    assert "2 GPU(s) (simulated: fake NVML)" in p.stderr
    records = [json.loads(ln) for ln in journal.read_text().splitlines()]
    tel = [r for r in records if r["kind"] == "telemetry"]
    assert 2 <= len(tel) <= 12  # ~1 per second, not every 0.5 s tick
    snap = replay(from_dict(r) for r in records)
    totals = {t.local_rank: t for t in snap.telemetry.totals}  # type: ignore[union-attr]
    for lr in (0, 1):
        t = totals[lr]
        assert t.mapping == "pid"
        assert t.peak_gpu_mem == (6 + 2 * lr) * GIB  # what the fake gives LOCAL_RANK lr
        assert t.peak_rss is not None and t.peak_rss >= 200 * MIB
    row = next(ln for ln in p.stderr.splitlines() if ln.startswith("│       0 │    1 │"))
    assert "8.0G" in row
    # The journal holds a sample every second, the live run one every 0.5 s; with the totals
    # journaled at the end, the replayed summary's resources are the live run's.
    from tui_launch.summary import print_summary

    buf = io.StringIO()
    print_summary(snap, None, buf, verbose=True)
    live = p.stderr[p.stderr.index("resources (telemetry)") : p.stderr.index("attempts")]
    assert live in buf.getvalue()


@pytest.mark.slow
def test_launcher_namespace_mismatch(tmp_path: Path) -> None:
    """NVML pids from another namespace, UUIDs in CUDA_VISIBLE_DEVICES: inferred, marked ~."""
    cvd = f"{fake.gpu_uuid(1)},{fake.gpu_uuid(0)}"
    env = base_env(**{tm.FAKE_ENV: "2,mismatch", "CUDA_VISIBLE_DEVICES": cvd})
    p = _run(
        ["--standalone", "--nproc-per-node", "2", "--gpu-interval", "0.5",
         "--log-dir", str(tmp_path / "logs"),
         str(WORKERS / "hog.py"), "--mb", "20", "--duty", "0.1", "--seconds", "3"],
        env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "~ inferred from LOCAL_RANK/CUDA_VISIBLE_DEVICES" in p.stderr
    rows = [ln for ln in p.stderr.splitlines() if ln.startswith("│       0 │")]
    assert len(rows) == 2 and all("~" in r for r in rows), rows


@pytest.mark.slow
@pytest.mark.parametrize("no_gpu", [True, False], ids=["no-gpu", "gpu"])
def test_launcher_no_gpu_opens_no_nvml(tmp_path: Path, no_gpu: bool) -> None:
    """``--no-gpu``: the fake NVML would give 2 GPUs (as the run without it shows), but the
    journal holds no GPU reading and says why; process telemetry goes on."""
    journal = tmp_path / "j.jsonl"
    env = base_env(**{tm.FAKE_ENV: "2"})
    p = _run(
        [*(["--no-gpu"] if no_gpu else []), "--standalone", "--nproc-per-node", "1",
         "--gpu-interval", "0.2", "--journal-samples", "0.2", "--journal", str(journal),
         "--log-dir", str(tmp_path / "logs"),
         str(WORKERS / "hog.py"), "--mb", "20", "--duty", "0.1", "--seconds", "1"],
        env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    tel = [r for r in read_journal(journal) if r["kind"] == "telemetry"]
    assert tel, "no telemetry journaled"
    ranks = [r for rec in tel for r in rec["ranks"]]
    assert any(r["rss"] for r in ranks)  # process telemetry is on either way
    if no_gpu:
        assert {(rec["gpu_state"], rec["gpu_note"]) for rec in tel} == {
            ("off", "GPU sampling off (--no-gpu)")
        }
        assert all(rec["gpus"] == [] for rec in tel)
        assert all(r["gpus"] == [] and r["gpu_mem"] is None for r in ranks)
        assert "GPU(s)" not in p.stderr
    else:
        assert {rec["gpu_state"] for rec in tel} == {"ok"}
        assert all(len(rec["gpus"]) == 2 for rec in tel)
        assert "2 GPU(s) (simulated: fake NVML)" in p.stderr


def test_no_gpu_never_initialises_nvml(sleepers: list[subprocess.Popen[bytes]]) -> None:
    """The sampler thread with ``gpu=False`` does not call NVML at all."""
    pids = spawn(sleepers, 1)
    store = RunStore()
    t = tm.Telemetry(store.post, nvml=fake, gpu=False, interval=0.05, journal_every=0)
    t.set_workers(0, targets(pids))
    t.start()
    wait_until(lambda: t.ticks >= 2, 30, "two ticks")
    t.stop()
    assert sum(fake.calls.values()) == 0, dict(fake.calls)
    last = store.snapshot().telemetry.latest  # type: ignore[union-attr]
    assert last.gpu_state == "off" and last.gpus == () and last.ranks[0].rss


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu-interval", "0"], "--gpu-interval must be a finite number of seconds > 0"),
        (["--journal-samples", "-1"], "--journal-samples must be a finite number of seconds >= 0"),
    ],
)
def test_bad_telemetry_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tui_launch.core.launch.args import parse

    with pytest.raises(SystemExit) as exc:
        parse([*argv, str(WORKERS / "noop.py")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _mib(cell: str) -> float:
    """The table's RSS cell (``92M``, ``1.2G``, ``-``) in MiB (0 when it shows none yet)."""
    try:
        return float(cell[:-1]) * (1024 if cell.endswith("G") else 1)
    except ValueError:
        return 0.0


@pytest.mark.slow
def test_live_dashboard_shows_telemetry_of_a_real_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Runner (2 workers holding 100 MiB) with telemetry on 2 fake GPUs, seen by the
    real Dashboard: CPU, RSS, GPU and GPU memory columns and the GPUs panel fill in."""
    import asyncio

    from textual.widgets import Static

    from tui_launch.core.launch.args import parse
    from tui_launch.core.run.config import RunConfig
    from tui_launch.core.run.runner import Runner
    from tui_launch.tui.app import Dashboard
    from tui_launch.tui.sources.live import LiveSource
    from tui_launch.tui.widgets.table import WorkersTable

    monkeypatch.setenv(tm.FAKE_ENV, "2")
    monkeypatch.setenv("TUILAUNCH_TEST_TOKEN", f"telemetry-live-{os.getpid()}")
    args, _ = parse(
        ["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"),
         str(WORKERS / "hog.py"), "--mb", "100", "--duty", "0.2", "--seconds", "30"]
    )  # fmt: skip
    store = RunStore()
    tel = tm.Telemetry(store.post, interval=0.3)
    runner = Runner(args, store, RunConfig(echo=False, mute_agent_console=True), telemetry=tel)
    runner.start()
    app = Dashboard(LiveSource(runner), refresh_hz=10, confirm=False)
    seen: dict[str, object] = {}

    async def main() -> None:
        async with app.run_test(size=(150, 42)) as pilot:
            table = app.query_one("#workers", WorkersTable)

            def rows() -> list[dict[str, str]]:
                labels = table.column_labels
                return [
                    dict(zip(labels, (str(c) for c in table.get_row_at(i)), strict=True))
                    for i in range(table.row_count)
                ]

            def filled() -> bool:
                # Every cell, and the RSS once the ranks touched their 100 MiB (under load a
                # sample can come while a rank is still touching its pages).
                got = rows()
                return len(got) == 2 and all(
                    r["GPU mem"].endswith("G")
                    and r["CPU %"].split()[-1].isdigit()
                    and _mib(r["RSS"]) >= 100
                    for r in got
                )

            deadline = asyncio.get_running_loop().time() + 60
            while not filled():
                assert asyncio.get_running_loop().time() < deadline, "no telemetry shown"
                await pilot.pause(0.1)
            seen["rows"] = rows()
            gpus = app.query_one("#gpus", Static)
            seen["title"] = gpus.border_title
            # What the panel shows, as text (its content is a width-aware renderable).
            shown = Console(width=60, record=True, file=io.StringIO())
            shown.print(gpus.content)
            seen["gpus"] = shown.export_text()
            app.save_screenshot("live-telemetry.svg", str(tmp_path))

    try:
        asyncio.run(main())
    finally:
        runner.stop(signal.SIGTERM, "test over")
        runner.wait(60)
    rows: list[dict[str, str]] = seen["rows"]  # type: ignore[assignment]
    assert [r["GPU"] for r in rows] == ["0", "1"]  # each worker's pid is on its own fake GPU
    assert [r["GPU mem"] for r in rows] == ["6.0G", "8.0G"]
    for r in rows:
        assert 100 <= _mib(r["RSS"]) <= 400, r["RSS"]  # RSS: 100 MiB held, plus the interpreter
    assert seen["title"] == "GPUs (simulated: fake NVML)"
    assert "H100 80GB HBM3" in str(seen["gpus"]) and "rank 0" in str(seen["gpus"])
