"""The straggler, inferred from outside: low-rate stack samples of every rank (issue 15).

In lockstep data parallelism every rank steps at the same rate, so the step counter cannot
name the rank that holds the others back. What can be observed without a code change is
where each rank is: a sample of every rank's Python stack every few seconds
(``py-spy dump --nonblocking``: the rank is read, never paused) says whether its main thread
waits inside a collective (:func:`~tui_launch.core.stacks.collective_of`). The ranks that
wait almost always are waiting for someone; the straggler is the one rank almost never found
waiting while the others almost always are. CPU utilisation from the telemetry goes with the
verdict as evidence (a rank doing more work per step is busier; one stopped or starved is
not).

:class:`StragglerJudge` is pure (samples in, verdict out); :class:`StragglerSampler` runs it
on a :class:`~tui_launch.core.periodic.Periodic` and posts a journaled
:class:`~tui_launch.core.events.Straggler` event whenever the verdict changes.
"""

from __future__ import annotations

import subprocess
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tui_launch.core.events import Event, Straggler
from tui_launch.core.periodic import Periodic
from tui_launch.core.stacks import collective_of, find_pyspy, parse_pyspy_json

__all__ = ["StragglerJudge", "StragglerSampler", "in_collective"]


class StragglerJudge:
    """Per rank, the share of recent samples found inside a collective; the straggler.

    A rank is named only when every rank has at least ``min_samples`` known samples in the
    last ``window``, every other rank's share is at least ``high`` and the rank's own share is
    below every other's by ``gap`` or more: a healthy run (every rank waiting about as often,
    or none) names nobody, and neither does one with two ranks that seldom wait.
    """

    def __init__(
        self, *, window: int = 24, min_samples: int = 10, high: float = 0.5, gap: float = 0.35
    ) -> None:
        self.window = window
        self.min_samples = min_samples
        self.high = high
        self.gap = gap
        self._seen: dict[int, deque[bool]] = {}
        self._named: int | None = None

    def reset(self) -> None:
        """Forget every sample (a new attempt)."""
        self._seen.clear()
        self._named = None

    def add(self, sample: dict[int, bool | None]) -> None:
        """One sample of every rank: global rank -> in a collective (None: not known)."""
        for rank, inside in sample.items():
            if inside is None:
                continue
            self._seen.setdefault(rank, deque(maxlen=self.window)).append(inside)

    def shares(self) -> dict[int, float]:
        """Global rank -> share of its known samples inside a collective."""
        return {r: sum(s) / len(s) for r, s in self._seen.items() if s}

    def samples(self) -> int:
        """The fewest known samples of any rank."""
        return min((len(s) for s in self._seen.values()), default=0)

    def straggler(self) -> int | None:
        """The inferred straggler's global rank, or None (see the class doc)."""
        if len(self._seen) < 2 or self.samples() < self.min_samples:
            return None
        shares = self.shares()
        lowest = min(shares, key=lambda r: shares[r])
        others = [s for r, s in shares.items() if r != lowest]
        # Hysteresis: a rank named stays named until its gap is half the naming gap, so that
        # one sample more or less does not flip the verdict back and forth.
        gap = self.gap / 2 if lowest == self._named else self.gap
        high = self.high - 0.1 if lowest == self._named else self.high
        self._named = (
            lowest if min(others) >= high and min(others) - shares[lowest] >= gap else None
        )
        return self._named


def in_collective(pid: int, pyspy: str, timeout: float = 2.0) -> bool | None:
    """Whether ``pid``'s main thread is inside a collective now (None: no stack read).

    ``--nonblocking``: py-spy reads the process's memory without stopping it, so sampling
    costs the rank nothing but a core's share of py-spy's own work.
    """
    try:
        p = subprocess.run(
            [pyspy, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if p.returncode != 0:
            return None
        threads = parse_pyspy_json(p.stdout, pid)
    except (OSError, subprocess.TimeoutExpired, ValueError, TypeError, AttributeError):
        return None
    main = next((t for t in threads if t.main), threads[0] if threads else None)
    if main is None or not main.frames:
        return None
    return collective_of(main.frames) is not None


class StragglerSampler:
    """Sample every rank's stack every ``interval`` seconds and post the straggler verdict.

    Args:
        post: the store's ``post``.
        cpu: global rank -> CPU % from the latest telemetry (None: not known).
        interval: seconds between two samples (0: off).
        pyspy: the py-spy binary (empty: find it; None: none, the sampler stays off).
        judge: the rule (default :class:`StragglerJudge`).
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        cpu: Callable[[int], float | None],
        *,
        interval: float = 5.0,
        pyspy: str | None = "",
        judge: StragglerJudge | None = None,
    ) -> None:
        self.post = post
        self.cpu = cpu
        self.interval = interval
        self.pyspy = find_pyspy() if pyspy == "" else pyspy
        self.judge = judge or StragglerJudge()
        self._lock = threading.Lock()
        self._attempt = -1
        self._targets: tuple[tuple[int, int], ...] = ()  # (global rank, pid)
        self._named: int | None = None
        self._loop: Periodic | None = None
        self.samples_taken = 0

    @property
    def enabled(self) -> bool:
        """Whether sampling can run (an interval and a py-spy binary)."""
        return self.interval > 0 and self.pyspy is not None

    def set_workers(self, attempt: int, targets: list[tuple[int, int]]) -> None:
        """A new attempt's ranks: ``(global rank, pid)``; the samples so far are dropped."""
        with self._lock:
            self._attempt, self._targets = attempt, tuple(targets)
            self.judge.reset()
            self._named = None

    def start(self) -> None:
        """Start sampling (once; nothing when disabled)."""
        if self._loop is None and self.enabled:
            self._loop = Periodic(
                "tuilaunch-stragglers",
                self.interval,
                self.tick,
                first_delay=self.interval,
                nice=10,
            ).start()

    def stop(self) -> None:
        """Stop sampling."""
        if self._loop is not None:
            self._loop.stop(timeout=3.0)

    def tick(self) -> None:
        """One sample of every rank, then the verdict (posted when it changed)."""
        with self._lock:
            attempt, targets = self._attempt, self._targets
        pyspy = self.pyspy
        if len(targets) < 2 or pyspy is None:
            return
        with ThreadPoolExecutor(len(targets), thread_name_prefix="straggler") as pool:
            found = dict(
                zip(
                    (gr for gr, _ in targets),
                    pool.map(lambda t: in_collective(t[1], pyspy), targets),
                    strict=True,
                )
            )
        with self._lock:
            if attempt != self._attempt:
                return  # the attempt changed meanwhile: these samples are stale
            self.samples_taken += 1
            self.judge.add(found)
            named = self.judge.straggler()
            if named == self._named:
                return
            self._named = named
            shares = self.judge.shares()
            samples = self.judge.samples()
        self.post(
            Straggler(
                attempt=attempt,
                global_rank=named,
                shares=tuple(sorted(shares.items())),
                samples=samples,
                cpu=tuple((gr, self.cpu(gr)) for gr, _ in targets),
            )
        )
