"""A flood under the log tailer: consoles get every byte, views and watches a bounded sample.

The progress and hang watches (and the dashboard's log view) are lossy line sinks: they need
the newest lines, not every line. A console (a raw sink) makes the tailer poll fast while
output flows; those polls must not make the lossy sinks decode and parse every line of a
flood (issue 15: the log-path benchmark). A real process floods a file here; the tailer's
raw sink must see every byte, the lossy sink at most ``SKIP_OVER`` bytes of lines per read
and, while the stream is more than ``SKIP_KEEP`` behind, at most one read per
``view_interval``.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PY

from tui_launch.core.logs.tail import LogSource, LogTailer

# A real process writes 40 MB for the tailer to follow.
pytestmark = pytest.mark.slow

LINES = 400_000  # 100 bytes each: 40 MB, far more than SKIP_OVER per poll
FLOOD = (
    "import sys\n"
    "w = sys.stdout.write\n"
    "for i in range({n}):\n"
    "    w(f'[flood] line {{i:07d}} ' + 'x' * 78 + '\\n')\n"
)


def test_lossy_sinks_get_a_bounded_sample_while_a_console_gets_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.touch()
    tailer = LogTailer(interval=0.02, view_interval=0.5)
    raw_bytes: list[int] = []
    reads: list[tuple[float, list[str]]] = []
    tailer.add_raw_sink(lambda src, fd, start, end, final: raw_bytes.append(end - start))
    tailer.add_sink(lambda src, lines: reads.append((time.monotonic(), list(lines))), lossy=True)
    tailer.add_sources([LogSource(0, 0, 0, "stdout", str(path), True, None)])
    tailer.start()
    try:
        with open(path, "ab") as out:
            proc = subprocess.run(
                [PY, "-c", FLOOD.format(n=LINES)], stdout=out, check=True, timeout=120
            )
        assert proc.returncode == 0
    finally:
        tailer.stop()
    size = path.stat().st_size
    assert size == LINES * 100
    assert sum(raw_bytes) == size  # the console: every byte
    assert reads, "the lossy sink saw nothing"
    # at most SKIP_OVER bytes behind is read whole; further behind, the last SKIP_KEEP bytes
    per_read = LogTailer.SKIP_OVER // 100 + 2
    assert max(len(lines) for _, lines in reads) <= per_read
    seen = sum(len(lines) for _, lines in reads)
    assert seen < LINES / 10, f"the lossy sink parsed {seen} of {LINES} lines"
    assert any("not shown here" in line for _, lines in reads for line in lines)
    # The last line is in the last read (the final read keeps the tail).
    assert reads[-1][1][-1].startswith(f"[flood] line {LINES - 1:07d} ")
    # One read per view_interval while polled (the final read at stop may follow at once). A
    # read that skips hands the sink its "not shown" note first, then the lines, at once.
    starts = [t for k, (t, _) in enumerate(reads) if k == 0 or t - reads[k - 1][0] > 0.1]
    # (the flood's last bytes, less than SKIP_KEEP behind, may be read at the next poll)
    gaps = [b - a for a, b in itertools.pairwise(starts[:-2])]
    assert all(g >= 0.8 * 0.5 for g in gaps), gaps
