"""The straggler, inferred from outside: low-rate stack samples of every rank.

In lockstep data parallelism every rank steps at the same rate, so the step counter cannot
name the rank that holds the others back. What can be observed without a code change is
where each rank is: a sample of every rank's Python stack every few seconds
(``py-spy dump --nonblocking``: the rank is read, never paused) says whether its main thread
waits inside a collective (:func:`~tui_launch.core.diagnosis.stacks.collective_of`). The ranks that
wait almost always are waiting for someone; the straggler is the one rank almost never found
waiting while the others almost always are. CPU utilisation from the telemetry goes with the
verdict as evidence (a rank doing more work per step is busier; one stopped or starved is
not).

A rank that is *stopped* (``SIGSTOP``: the ``slow`` and ``hang`` injections, a pause, a
debugger) is read from ``/proc/<pid>/stat`` before any py-spy: it waits for nobody, it is
the one the others wait for. Its stack would say where it was stopped, which is inside a
collective as often as the others are when steps are short, so a rank slowed by stop/continue
cycles would look like everyone else (``--inject slow``).

Cost: one py-spy process per rank and sample (its CPU is in py-spy, a child of the launcher;
``bench/stragglers.py tick`` measures it), except where the live poll of the Flight Recorder
(on by default) already holds a stack of the rank taken since the rank's previous sample: its
responder answers every poll with every thread's stack, so the sample reads that instead of
starting py-spy (at idle with 8 ranks, the py-spy runs were 1.7 % of a core, more than every
loop of the launcher together; ``bench/bootstrap.py idle``). Once the verdict is settled on a
balanced run the sampler backs off (doubling its interval up to ``backoff`` times), and it
comes back to the full rate as soon as the shares drift apart, a sample looks like a
straggler's (one rank out of a collective while all the others wait) or a rank is named.

:class:`StragglerJudge` is pure (samples in, verdict out); :class:`StragglerSampler` runs it
on a :class:`~tui_launch.core.periodic.Periodic` and posts a journaled
:class:`~tui_launch.core.model.events.Straggler` event whenever the verdict changes.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from tui_launch.core.diagnosis.records import Answer
from tui_launch.core.diagnosis.stacks import collective_of, find_pyspy, parse_pyspy_json, run_pyspy
from tui_launch.core.model.events import Event, Straggler
from tui_launch.core.periodic import Periodic

__all__ = ["StragglerJudge", "StragglerSampler", "in_collective", "is_stopped"]


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

    def balanced(self) -> bool:
        """Enough samples, nobody named, and every rank's share within half the naming gap of
        every other's: a healthy run, where sampling less often loses nothing."""
        if len(self._seen) < 2 or self.samples() < self.min_samples or self._named is not None:
            return False
        shares = self.shares().values()
        return max(shares) - min(shares) < self.gap / 2

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


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state ``T``) or a tracer (``t``) now."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")"
    cut = stat.rfind(b")")
    return cut >= 0 and stat[cut + 2 : cut + 3] in (b"T", b"t")


def in_collective(pid: int, pyspy: str, timeout: float = 2.0) -> bool | None:
    """Whether ``pid``'s main thread is inside a collective now (None: no stack read).

    A stopped process is not (False, without py-spy): it is not waiting for anybody, whatever
    its stack says. ``--nonblocking``: py-spy reads the process's memory without stopping it,
    so sampling costs the rank nothing but a core's share of py-spy's own work.
    """
    if is_stopped(pid):
        return False
    try:
        p = run_pyspy(pyspy, pid, "--nonblocking", timeout=timeout)
        if p.returncode != 0:
            return None
        threads = parse_pyspy_json(p.stdout, pid)
    except (OSError, subprocess.TimeoutExpired, ValueError, TypeError, AttributeError):
        return None
    main = next((t for t in threads if t.main), threads[0] if threads else None)
    if main is None or not main.frames:
        return None
    return collective_of(main.frames) is not None


def _lone_outsider(sample: dict[int, bool | None]) -> bool:
    """Whether one rank of three or more is outside a collective while all the others wait
    in one: what a straggler looks like. On a balanced run of many ranks that is rare (each
    rank must be the only one out); with a straggler it is most samples."""
    known = [inside for inside in sample.values() if inside is not None]
    return len(known) >= 3 and known.count(False) == 1


class StragglerSampler:
    """Sample every rank's stack every ``interval`` seconds and post the straggler verdict.

    Args:
        post: the store's ``post``.
        cpu: global rank -> CPU % from the latest telemetry (None: not known).
        interval: seconds between two samples (0: off).
        pyspy: the py-spy binary (empty: find it; None: none, the sampler stays off).
        judge: the rule (default :class:`StragglerJudge`).
        backoff: on a balanced run (:meth:`StragglerJudge.balanced`) the interval doubles
            after each sample, up to ``backoff`` times ``interval`` (1: never backs off); a
            sample that looks like a straggler's (:func:`_lone_outsider`) or shares that
            drift apart bring it back to ``interval`` at once.
        recent: global rank -> (``time.monotonic()``, answer) of the live poll's latest
            answer of each rank (``CollectivePoller.latest``; None or empty without the
            bootstrap). A rank with an answer newer than its previous sample and at most
            ``RECENT`` seconds old is sampled from its main thread's stack there, not by py-spy.
    """

    RECENT = 4.0  # two polls: an older answer is not "now" (a rank that stopped answering)

    def __init__(
        self,
        post: Callable[[Event], object],
        cpu: Callable[[int], float | None],
        *,
        interval: float = 5.0,
        pyspy: str | None = "",
        judge: StragglerJudge | None = None,
        backoff: float = 8.0,
        recent: Callable[[], Mapping[int, tuple[float, Answer]]] | None = None,
    ) -> None:
        self.post = post
        self.cpu = cpu
        self.interval = interval
        self.pyspy = find_pyspy() if pyspy == "" else pyspy
        self.judge = judge or StragglerJudge()
        self.backoff = max(1.0, backoff)
        self._delay = interval  # the back-off's state: seconds to the next sample
        self._lock = threading.Lock()
        self._attempt = -1
        self._targets: tuple[tuple[int, int], ...] = ()  # (global rank, pid)
        self._named: int | None = None
        self._loop: Periodic | None = None
        self.recent = recent
        self._used: dict[int, float] = {}  # global rank -> time of the answer last sampled
        self.from_polls = 0  # samples read from the live poll's stacks
        self.from_pyspy = 0  # samples that started py-spy

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
            self._delay = self.interval
            self._used.clear()

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

    def tick(self) -> float:
        """One sample of every rank, then the verdict (posted when it changed); returns the
        seconds to the next sample (the interval, longer on a balanced run)."""
        with self._lock:
            attempt, targets = self._attempt, self._targets
        pyspy = self.pyspy
        if len(targets) < 2 or pyspy is None:
            return self.interval
        found = self._from_polls(targets)
        rest = [t for t in targets if t[0] not in found]
        if rest:
            self.from_pyspy += len(rest)
            with ThreadPoolExecutor(len(rest), thread_name_prefix="straggler") as pool:
                found.update(
                    zip(
                        (gr for gr, _ in rest),
                        pool.map(lambda t: in_collective(t[1], pyspy), rest),
                        strict=True,
                    )
                )
        found = {gr: found[gr] for gr, _ in targets}
        with self._lock:
            if attempt != self._attempt:
                return self._delay  # the attempt changed meanwhile: these samples are stale
            self.judge.add(found)
            named = self.judge.straggler()
            if self.judge.balanced() and not _lone_outsider(found):
                self._delay = min(self._delay * 2, self.interval * self.backoff)
            else:
                self._delay = self.interval
            delay = self._delay
            if named == self._named:
                return delay
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
        return delay

    def _from_polls(self, targets: tuple[tuple[int, int], ...]) -> dict[int, bool | None]:
        """The samples the live poll already holds: each rank's main thread from an answer
        newer than its previous sample (a stopped rank: not waiting, as in ``in_collective``)."""
        if self.recent is None:
            return {}
        latest = self.recent()
        if not latest:
            return {}
        now = time.monotonic()
        found: dict[int, bool | None] = {}
        for gr, pid in targets:
            at, answer = latest.get(gr, (None, None))
            if at is None or answer is None or now - at > self.RECENT:
                continue
            if at <= self._used.get(gr, float("-inf")):
                continue  # already sampled: one answer is one sample, not several
            main = next((t for t in answer.threads or () if t.main), None)
            if main is None or not main.frames:
                continue
            self._used[gr] = at
            self.from_polls += 1
            found[gr] = False if is_stopped(pid) else collective_of(main.frames) is not None
        return found
