"""The headless console: every byte a rank writes reaches it, in whole lines, in order per rank;
and tuilaunch's own lines, and torch's, each start a line.

Default console mode (no ``--redirects``/``--tee``): torchrun's workers write straight to the
inherited console, where each ``write(2)`` lands whole, so lines written together never mix
with another rank's. tuilaunch's workers write to their rank files and the tailer copies each
new range to the console. A writer without a flush per line (``workers/blocks.py``: an 8 KB
``BufferedWriter``, or C-stdio-like exact 8 KB blocks that cut lines anywhere) makes a file
grow a block at a time, and a block becomes visible a page at a time: a range could end inside
a line, and another rank's range then cut it in two (its head glued onto another rank's line,
its tail on a line of its own). The console copy now ends each range at a line end and holds
the rest back until the line ends (or the writer waits mid-line, as a progress bar does).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest
from conftest import TOKEN_VAR, WORKERS, base_env, torchrun_cmd, tuilaunch_cmd, wait_gone

# Every test runs tuilaunch or torchrun and reads its console.
pytestmark = pytest.mark.slow

BLOCKS = str(WORKERS / "blocks.py")
BAR = str(WORKERS / "bar.py")
# Starts and exits at once, importing nothing: the banner is the launcher's, not the ranks'.
QUICK = [str(WORKERS / "quiet.py"), "--seconds", "0"]
WORKER_LINE = re.compile(rb"^R(\d+) (\d{7}) x+$")


def _run(cmd: list[str], console: Path, tmp: Path, timeout: float, **extra: str) -> int:
    """Run ``cmd`` with stdout and stderr to the file ``console`` (as ``> f 2>&1`` does);
    kill whatever is left of it afterwards."""
    token = uuid.uuid4().hex
    env = base_env(**{TOKEN_VAR: token, "TMPDIR": str(tmp)}, **extra)
    with open(console, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            left = wait_gone(token, 10)
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            assert not left, f"processes left behind: {left}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "lines"),
    [
        # whole lines per write (8,100 bytes): torchrun's console keeps them whole; the rank
        # file shows them a page at a time (about 1 line in 200,000 was cut before)
        ("blocks", 400_000),
        # exact 8 KB blocks, lines cut anywhere (C stdio): nearly every range ended mid-line
        ("cut", 100_000),
    ],
)
def test_console_gets_every_line_whole_in_order(tmp_path: Path, how: str, lines: int) -> None:
    console = tmp_path / "console.txt"
    args = ["--lines", str(lines)] + (["--cut"] if how == "cut" else [])
    cmd = tuilaunch_cmd("--standalone", "--nproc-per-node", "4", BLOCKS, *args)
    assert _run(cmd, console, tmp_path, 100) == 0, console.read_bytes()[-3000:]
    data = console.read_bytes()
    seen: Counter[int] = Counter()
    broken = []
    for ln in data.split(b"\n"):
        if b"xxxx" not in ln:
            continue  # the launcher's own lines
        m = WORKER_LINE.match(ln)
        if m is None or len(ln) != 99:
            broken.append(ln[:140])  # a head glued onto another rank's line, or a lone tail
            continue
        rank, i = int(m[1]), int(m[2])
        if i != seen[rank]:
            broken.append(b"rank %d: line %d after %d" % (rank, i, seen[rank] - 1))
        seen[rank] = i + 1
    assert broken == [], f"{len(broken)} broken lines, first: {broken[:4]}"
    assert dict(seen) == {r: lines for r in range(4)}


@pytest.mark.timeout(120)
def test_tuilaunch_lines_start_a_line_after_a_bar_ended_with_cr(tmp_path: Path) -> None:
    """tqdm's ``leave=False`` clears its bar with ``\\r`` + spaces + ``\\r``, no newline: the
    next ``[tuilaunch]`` line (the group's end) must still start a line of the file."""
    console = tmp_path / "console.txt"
    cmd = tuilaunch_cmd(
        "--standalone", "--nproc-per-node", "2", BAR, "--total", "20", "--no-leave"
    )  # fmt: skip
    assert _run(cmd, console, tmp_path, 100) == 0, console.read_bytes()[-3000:]
    data = console.read_bytes()
    # The workers' bytes all came (each rank's bar ends with its clearing \r).
    assert data.count(b"rank 0 starting\n") == 1 and data.count(b"rank 1 starting\n") == 1
    assert data.count(b" 20/20 [") == 2, data[-2000:]
    tags = data.count(b"[tuilaunch]")
    at_start = sum(1 for ln in data.split(b"\n") if ln.startswith(b"[tuilaunch]"))
    assert tags >= 3 and at_start == tags, data.decode(errors="replace")[-3000:]
    assert b"\r[tuilaunch]" not in data and b" [tuilaunch]" not in data


# The head torch's log formatter puts on each line of a record of the ``torch`` logger (under
# tuilaunch torch's run.py is the module ``torch.distributed.run``; under torchrun it is
# ``__main__``, whose records Python's last-resort handler writes bare).
GLOG_HEAD = re.compile(r"^[EWIF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ")


def _banner(data: bytes) -> list[str]:
    """torch's OMP_NUM_THREADS banner lines (each a whole line of the console), heads cut."""
    out = []
    for ln in data.decode(errors="replace").splitlines():
        body = GLOG_HEAD.sub("", ln)
        if body.startswith("*****") or body.startswith("Setting OMP_NUM_THREADS"):
            out.append(body)
    return out


@pytest.mark.timeout(180)
def test_torch_messages_pass_through_as_torchrun_shows_them(tmp_path: Path) -> None:
    """torch's OMP_NUM_THREADS banner (its log records on the launcher's fd 2) comes
    unprefixed, every line at a line start, as under torchrun, in every run: before, the lines
    written before the headless console was attached went out as they were and the rest got a
    ``[tuilaunch]`` prefix (half the banner one way, half the other)."""
    theirs = tmp_path / "torchrun.txt"
    cmd = torchrun_cmd("--standalone", "--nproc-per-node", "2", *QUICK)
    assert _run(cmd, theirs, tmp_path, 100) == 0, theirs.read_bytes()[-3000:]
    expected = _banner(theirs.read_bytes())
    assert len(expected) == 3, theirs.read_text(errors="replace")[-3000:]
    for _ in range(2):  # the prefixing depended on a race: more than one run
        ours = tmp_path / "tuilaunch.txt"
        cmd = tuilaunch_cmd("--standalone", "--nproc-per-node", "2", *QUICK)
        assert _run(cmd, ours, tmp_path, 100) == 0, ours.read_bytes()[-3000:]
        assert _banner(ours.read_bytes()) == expected, ours.read_text(errors="replace")[-3000:]


# Rank 0 leaves a line unended twice while rank 1 writes whole lines (the ranks take turns
# through marker files): first exactly at a page boundary of its file, as a long write looks
# while its writer is descheduled mid-copy; then a prompt, which ends anywhere.
MID_WRITE = r"""
import os, time
r, here = int(os.environ["RANK"]), os.path.dirname(os.path.abspath(__file__))
page = os.sysconf("SC_PAGE_SIZE")

def mark(name):
    open(os.path.join(here, name), "w").close()

def wait(name):
    while not os.path.exists(os.path.join(here, name)):
        time.sleep(0.005)

if r == 0:
    os.write(1, b"R0 " + b"x" * (page - 3))  # the file ends on a page boundary, mid-line
    mark("paused1"); wait("done1")
    os.write(1, b"x" * 96 + b"\n")
    os.write(1, b"R0 prompt> ")
    mark("paused2"); wait("done2")
    os.write(1, b"answered\n")
else:
    for phase in ("1", "2"):
        wait("paused" + phase)
        # Longer than a bar's hold: the tailer has looked at rank 0 meanwhile (in phase 1 well
        # inside the hold of a write under way; in phase 2 long enough for a loaded machine).
        time.sleep(0.1 if phase == "1" else 0.5)
        for i in range(20):
            os.write(1, b"R1 %s %02d\n" % (phase.encode(), i))
            time.sleep(0.005)
        mark("done" + phase)
"""


@pytest.mark.timeout(120)
def test_a_line_cut_on_a_page_boundary_waits_a_prompt_does_not(tmp_path: Path) -> None:
    script = tmp_path / "mid_write.py"
    script.write_text(MID_WRITE)
    console = tmp_path / "console.txt"
    cmd = tuilaunch_cmd("--standalone", "--nproc-per-node", "2", str(script))
    assert _run(cmd, console, tmp_path, 100) == 0, console.read_bytes()[-3000:]
    lines = console.read_bytes().split(b"\n")
    page = os.sysconf("SC_PAGE_SIZE")
    # The long line is whole, on a line of its own, though rank 1 wrote 20 lines meanwhile.
    assert b"R0 " + b"x" * (page - 3 + 96) in lines, [ln[:80] for ln in lines]
    assert sum(ln.startswith(b"R1 1 ") for ln in lines) == 20, [ln[:80] for ln in lines]
    # The prompt showed at once: rank 1's next line came after it, on the prompt's line.
    assert any(ln.startswith(b"R0 prompt> R1 2 ") for ln in lines), [ln[:80] for ln in lines]
