"""Stack dumps of this node's ranks: taken, kept in the run directory, told to the store.

The control part that owns a dump from the request to the journal line. Whoever asks
(the ``d`` key, the control API, the hang watch, the runner before torch tears a failed group
down) gets the same thing: every live local rank dumped in parallel (py-spy, or faulthandler
with ``--dump-via-faulthandler``), the dump saved under ``<run_dir>/stacks/`` as text and JSON,
and one :class:`~tui_launch.core.model.events.StacksDumped` posted, which points to those files and
carries the verdict and where each rank is.

With the Flight Recorder collected (the default: ``responders`` gives the directory of
the ranks' responder sockets), every dump also asks each rank's responder, in parallel with the
stacks, for its records: they go into the dump (``StackDump.records``, so the verdict is the
collective one), each rank's raw record into ``flightrec/`` beside the stacks (as JSON, and
as the pickle torch's analyser ``torchfrtrace`` reads, named with the host, attempt and
rank), and a rank py-spy could not read gets the responder's stacks instead. The Flight
Recorder is collected by default (the worker bootstrap is on unless ``--no-bootstrap``).

Before a teardown (:meth:`Dumper.survivors`) a survivor that py-spy finds leaving or gone (gloo
raised in it within milliseconds of its peer's death) is shown by its last words: the traceback
it printed on stderr as it raised (:mod:`~tui_launch.core.diagnosis.stacks.lastwords`), the
exact place it was in when the collective broke, with no code in the rank.

One dump at a time: a second request while one runs waits for it (dumps are short, bounded by
their time limit). The caller's thread does the work: the dashboard calls from a worker thread,
never from its UI thread.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from tui_launch.core.diagnosis import frdump, frjudge
from tui_launch.core.diagnosis.collectives import INTERVAL as POLL_INTERVAL
from tui_launch.core.diagnosis.collectives import rank_collective
from tui_launch.core.diagnosis.records import (
    Answer,
    analyser_record,
    gather,
    poke_nccl_pipes,
    responder_stack,
)
from tui_launch.core.diagnosis.stacks import (
    ProcessStack,
    RankStack,
    StackDump,
    Target,
    dump_ranks,
    dump_via_faulthandler,
    dumped_event,
    load,
    save,
    verdict,
)
from tui_launch.core.diagnosis.stacks.collective import collective_verdict
from tui_launch.core.diagnosis.stacks.lastwords import exiting, stack_of_traceback
from tui_launch.core.diagnosis.stacks.model import ThreadStack
from tui_launch.core.diagnosis.stacks.pyspy import MAX_CHILDREN, with_native
from tui_launch.core.diagnosis.stacks.save import rewrite
from tui_launch.core.diagnosis.stacks.verdict import SEES_MORE, place_of
from tui_launch.core.model.commands import NO_WORKER, DumpStacks, control_event
from tui_launch.core.model.diskspace import write_error
from tui_launch.core.model.errors import peer_failure, tail_lines
from tui_launch.core.model.events import (
    CollectiveVerdictFound,
    ControlAction,
    Event,
    FrGroup,
    StacksDumped,
)
from tui_launch.core.model.layout import dump_analyser_record, dump_record, dump_records_dir
from tui_launch.core.workers.table import RanksView, RankTable, process_alive

DEFAULT_TIMEOUT = 5.0
BEFORE_KILL = "before-kill"
# How old a polled answer may be to stand in for a rank that no longer answers (seconds).
_RECENT = 10.0
# A rank whose latest live-poll answer is older than this has stopped answering; a dump asks
# it for its records for SILENT_WAIT seconds only.
SILENT_AFTER = 2 * POLL_INTERVAL + 1.0
SILENT_WAIT = 0.3
# Dumps kept in memory for the views (the files keep all of them).
_KEPT = 32
# How much of a survivor's stderr is read for its last traceback (a framework's training loop
# is 60 frames deep, four lines each).
_LAST_WORDS_LINES = 400
LAST_WORDS = "traceback on stderr"


@dataclass(frozen=True)
class Taken:
    """A dump and the event that announced it."""

    dump: StackDump
    event: StacksDumped


class Dumper:
    """Takes, keeps and announces stack dumps of this node's live ranks.

    Args:
        post: the run store's ``post``.
        ranks: the rank table (who is alive, with which pid and global rank).
        run_dir: returns the run directory, making one if torch has not yet.
        stderr_logs: returns each local rank's stderr file (for the faulthandler method).
        via_faulthandler: ``--dump-via-faulthandler``: signal the ranks and read their stderr
            instead of attaching py-spy.
        pyspy: the py-spy binary (empty: find it; None: there is none).
        responders: returns the directory of the ranks' responder sockets (None: the Flight
            Recorder is not collected).
        recent: each rank's latest answer from the live poll, with its monotonic time: a
            survivor that left Python before the dump (gloo raises in it within milliseconds
            of its peer's death) is shown as it was then.
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        ranks: RankTable,
        run_dir: Callable[[], str],
        stderr_logs: Callable[[], dict[int, str]],
        *,
        via_faulthandler: bool = False,
        pyspy: str | None = "",
        responders: Callable[[], str | None] | None = None,
        recent: Callable[[], dict[int, tuple[float, Answer]]] | None = None,
    ) -> None:
        self._post = post
        self._ranks = ranks
        self._run_dir = run_dir
        self._stderr_logs = stderr_logs
        self.via_faulthandler = via_faulthandler
        self.pyspy = pyspy
        self._responders = responders
        self.recent = recent
        self._lock = threading.Lock()
        self._lock_answers = threading.Lock()  # the record askers of one dump
        # Told of every dump taken, after it was posted, on the taker's thread (the hang
        # watch: did the ranks move again; the job-wide dumps: tell the other nodes).
        self.listeners: list[Callable[[Taken], None]] = []
        self.last: Taken | None = None
        self._kept: dict[str, StackDump] = {}
        self._survivors: tuple[int, StacksDumped | None] | None = None  # (attempt, event)

    def targets(self, check: bool = True) -> list[Target]:
        """``(local rank, global rank, pid)`` of every rank of the current attempt still alive
        (``check=False``: with no exit recorded, not asking ``/proc``: the live poll, which a
        dead rank's socket answers at once by refusing)."""
        view = self._ranks.view()
        out = []
        for local, pid in sorted(view.pids.items()):
            if local in view.exits or (check and not process_alive(pid)):
                continue
            out.append((local, view.global_ranks.get(local, local), pid))
        return out

    def take(
        self,
        reason: str,
        source: str = "api",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_children: int = MAX_CHILDREN,
        native: bool = False,
    ) -> Taken | None:
        """Dump every live rank now, save it, post :class:`StacksDumped`; None when no rank
        runs (a :class:`ControlAction` says so). ``native``: the C/C++ frames of each running
        rank's main thread too (it pauses each for about a second: a confirmed hang)."""
        with self._lock:
            targets = self.targets()
            attempt = self._ranks.attempt
            if not targets:
                refused = DumpStacks(reason, source=source)
                self._post(control_event(refused, False, NO_WORKER))
                return None
            dump, answers = self._dump_with_records(targets, reason, timeout, max_children)
            if native and not self.via_faulthandler:
                dump = with_native(dump, self.pyspy)
            v = verdict(dump)
            try:
                saved = save(dump, self._run_dir(), v)
                _save_records(saved.directory, answers, attempt)
            except OSError as e:  # a full disk: say where, never raise into torch's teardown
                where = e.filename if isinstance(e.filename, str) else self._run_dir()
                self._post(ControlAction.on_run("dump", source, False, write_error(e, where)))
                return None
            event = replace(dumped_event(dump, saved, attempt, v), source=source)
            self._kept[saved.directory] = dump
            while len(self._kept) > _KEPT:
                self._kept.pop(next(iter(self._kept)))
            self._post(event)
            found = _collective_event(dump, attempt, saved.directory, answers)
            if found is not None:
                self._post(found)
            taken = Taken(dump, event)
            self.last = taken
        for listener in list(self.listeners):
            listener(taken)
        return taken

    def _dump(self, targets: list[Target], reason: str, timeout: float, children: int) -> StackDump:
        if self.via_faulthandler:
            return dump_via_faulthandler(
                targets, self._stderr_logs(), reason, timeout=min(timeout, 2.0)
            )
        return dump_ranks(targets, reason, timeout, max_children=children, pyspy=self.pyspy)

    def _dump_with_records(
        self, targets: list[Target], reason: str, timeout: float, children: int
    ) -> tuple[StackDump, dict[int, Answer]]:
        """The stacks and, when collected, every rank's records, asked at the same time."""
        directory = self._responders() if self._responders is not None else None
        leaving = reason == BEFORE_KILL
        if not directory:
            dump = self._dump(targets, reason, timeout, children)
            return (self._last_words(dump) if leaving else dump), {}
        answers: dict[int, Answer] = {}
        recent = self.recent() if self.recent is not None else {}
        # Ranks the live poll has not heard from for two polls (SIGSTOPped, a C call holding
        # the GIL): asked too, but not waited for as long. Waiting 2.5 s for them made every
        # dump of such a hang 2 s longer, the suspicion and the confirmation each.
        since = time.monotonic() - SILENT_AFTER
        silent = {g for _, g, _ in targets if g in recent and recent[g][0] < since}

        def ask(ranks: list[int], wait: float) -> None:
            # Never longer than the stacks: a rank that does not answer is stopped or leaving.
            got = gather(directory, ranks, "dump", wait)
            with self._lock_answers:
                answers.update(got)

        poke_nccl_pipes(directory)  # NCCL's own dump too, where there is one
        talking = [g for _, g, _ in targets if g not in silent]
        askers = [(talking, min(2.5, timeout / 2)), (sorted(silent), SILENT_WAIT)]
        threads = [
            threading.Thread(target=ask, args=a, name="tuilaunch-records", daemon=True)
            for a in askers
            if a[0]
        ]
        for t in threads:
            t.start()
        dump = self._dump(targets, reason, timeout, children)
        if leaving:
            dump = self._last_words(dump)
        for t in threads:
            t.join(2.5)
        with self._lock_answers:
            got = dict(answers)
        ages: dict[int, float] = {}
        now = time.monotonic()
        if not leaving:
            got = _with_looks(directory, got, recent, now)
        for g, (at, old) in recent.items():
            a = got.get(g)
            if (a is None or a.raw is None) and now - at <= _RECENT:
                got[g] = old  # the survivor as the last poll saw it
                ages[g] = now - at
        return with_records(dump, got, ages, prefer_recent=leaving), got

    def add_native(self, taken: Taken) -> StackDump:
        """A kept dump with the C/C++ frames of each running rank's main thread added, its
        files rewritten in place (the hang watch confirms a hang on the Python stacks and
        posts it first, then reads these, which pause each rank for about a second and take
        several on a loaded machine)."""
        with self._lock:
            dump = with_native(taken.dump, self.pyspy)
            if dump is taken.dump:
                return dump
            try:
                rewrite(taken.event.path, dump)
            except OSError:
                return taken.dump  # the Python stacks stay: a full disk is said elsewhere
            if taken.event.path in self._kept:
                self._kept[taken.event.path] = dump
            return dump

    def peek(self, reason: str = "peek", timeout: float = 2.0) -> StackDump | None:
        """A quick dump of the live ranks that is neither kept nor announced (the hang watch
        checks whether hung ranks move again); None when no rank runs."""
        with self._lock:
            targets = self.targets()
            return self._dump(targets, reason, timeout, 0) if targets else None

    def survivors(self, attempt: int) -> StacksDumped | None:
        """Before torch terminates a failed group: dump the ranks still alive, at most once per
        attempt (a second call returns the first dump). One py-spy per rank and no children,
        so that it adds no more than about a second to the restart (bench/run.py restart)."""
        done = self._survivors
        if done is not None and done[0] == attempt:
            return done[1]
        taken = None
        if self.targets():
            taken = self.take("before-kill", "before-kill", timeout=0.8, max_children=0)
        event = taken.event if taken is not None else None
        if event is None:
            # Every survivor already left (gloo raises in them within milliseconds of their
            # peer's death): their last words, and what the live poll last saw of them, are
            # the evidence there is.
            event = self._from_leftovers(attempt)
        self._survivors = (attempt, event)
        return event

    def _last_words(self, dump: StackDump) -> StackDump:
        """``dump`` with each survivor of the first failure that py-spy found leaving (or that
        is already gone) shown by the last traceback it printed, when it printed one."""
        view = self._ranks.view()
        logs = self._stderr_logs()
        first = _first_exit(view)
        ranks = {r.local_rank: r for r in dump.ranks}
        for local, pid in sorted(view.pids.items()):
            had = ranks.get(local)
            if had is not None and not _leaving(had):
                continue
            said = stack_of_traceback(tail_lines(logs.get(local), _LAST_WORDS_LINES))
            # The first rank to exit is the failure itself, not a survivor of it, unless its
            # last words say a peer broke (two exits seen in the same look at the ranks).
            if said is None or (local == first and not peer_failure(said.exception)):
                continue
            main = ThreadStack(0, "MainThread", said.frames, main=True)
            state = had.process.state if had is not None else ""
            proc = ProcessStack(pid, state, LAST_WORDS, (main,), raised=said.exception)
            ranks[local] = RankStack(local, view.global_ranks.get(local, local), proc)
        return replace(dump, ranks=tuple(ranks[k] for k in sorted(ranks)))

    def _from_leftovers(self, attempt: int) -> StacksDumped | None:
        """A before-teardown dump of the ranks other than the first to exit, all gone: the
        traceback each printed, else the live poll's last answer (None without either)."""
        recent = self.recent() if self.recent is not None else {}
        view = self._ranks.view()
        if view.attempt != attempt:
            return None
        first = _first_exit(view)
        now = time.monotonic()
        ranks = []
        answers: dict[int, Answer] = {}
        ages: dict[int, float] = {}
        for local, pid in sorted(view.pids.items()):
            g = view.global_ranks.get(local, local)
            got = recent.get(g)
            if got is not None and local != first and now - got[0] <= _RECENT:
                answers[g], ages[g] = got[1], now - got[0]
            ranks.append(RankStack(local, g, ProcessStack(pid=pid, state="", method="none")))
        with self._lock:
            dump = self._last_words(StackDump(BEFORE_KILL, time.time(), 0.0, tuple(ranks)))
            dump = with_records(dump, answers, ages)
            kept = tuple(r for r in dump.ranks if not _leaving(r))
            if not kept:
                return None
            told = {r.process.method for r in kept}
            method = LAST_WORDS if told == {LAST_WORDS} else "responder"
            dump = replace(dump, ranks=kept, method=method)
            v = verdict(dump)
            try:
                saved = save(dump, self._run_dir(), v)
                _save_records(saved.directory, answers, attempt)
            except OSError:
                return None
            event = replace(dumped_event(dump, saved, attempt, v), source="before-kill")
            self._kept[saved.directory] = dump
            self._post(event)
            self.last = Taken(dump, event)
        return event

    def dump_stacks(self, reason: str = "api", source: str = "api") -> StacksDumped | None:
        """The control API: dump every live rank; the event (None: no rank runs)."""
        taken = self.take(reason, source)
        return taken.event if taken is not None else None

    def load(self, path: str) -> StackDump | None:
        """The dump kept at ``path`` (from memory, else from its ``stacks.json``)."""
        dump = self._kept.get(path)
        if dump is not None:
            return dump
        try:
            return load(path)
        except (OSError, ValueError, KeyError, TypeError):
            return None


def with_records(
    dump: StackDump,
    answers: dict[int, Answer],
    ages: dict[int, float] | None = None,
    *,
    prefer_recent: bool = False,
) -> StackDump:
    """``dump`` with the ranks' records, and the responder's stacks for a rank py-spy could not
    read or found outside Python (its error kept when the responder did not answer either);
    ``ages``: seconds since an answer taken from the live poll rather than now.
    ``prefer_recent`` (before a teardown): a rank that no longer answers is leaving (gloo raised
    in it, its interpreter is exiting), so the live poll's answer replaces its stack too."""
    ages = ages or {}
    ranks = []
    for r in dump.ranks:
        a = answers.get(r.global_rank)
        main = r.process.main_thread
        empty = main is None or not main.frames
        recent = prefer_recent and r.global_rank in ages and not r.process.raised
        if a is not None and a.threads and (empty or recent):
            proc = responder_stack(r.pid, a.threads, r.process.state)
            if r.global_rank in ages:
                proc = replace(proc, method=f"responder, {ages[r.global_rank]:.1f} s earlier")
            r = replace(r, process=proc)
        ranks.append(r)
    records = tuple(answers[g].record for g in sorted(answers))
    return replace(dump, ranks=tuple(ranks), records=records)


def _with_looks(
    directory: str, answers: dict[int, Answer], recent: dict[int, tuple[float, Answer]], now: float
) -> dict[int, Answer]:
    """Each answer's record with the rank's sequence number at two other looks: the live
    poll's last one before the dump, and a status request now, after the stacks (a rank that
    advanced between them is moving: a skew of one collective between two looks at moving
    ranks is not a hang)."""
    asked = [g for g, a in answers.items() if a.raw is not None]
    later = gather(directory, asked, "status", 0.5) if asked else {}
    out = dict(answers)
    for g in asked:
        looks = []
        before = recent.get(g)
        if before is not None and now - before[0] <= _RECENT:
            looks.append(before[1].record.last_enqueued)
        after = later.get(g)
        if after is not None and after.raw is not None:
            looks.append(after.record.last_enqueued)
        a = answers[g]
        out[g] = replace(a, record=replace(a.record, looks=tuple(looks)))
    return out


def _first_exit(view: RanksView) -> int | None:
    """The local rank seen exiting first in this attempt (None: none exited)."""
    return min(view.exit_times, key=lambda lr: view.exit_times[lr], default=None)


def _leaving(rank: RankStack) -> bool:
    """Whether a rank's stack shows it leaving (no frame, or only the exit handlers) rather
    than in the program; a stopped rank is where it was stopped, not leaving."""
    proc = rank.process
    return proc.state not in ("T", "t") and not proc.raised and exiting(proc.main_thread)


def _collective_event(
    dump: StackDump, attempt: int, path: str, answers: dict[int, Answer]
) -> CollectiveVerdictFound | None:
    """The collective-level verdict of a dump with records, as the journal's event, with each
    process group that waits as ``tuilaunch why``'s judge sees the same records (the Stacks
    tab lists them)."""
    if not dump.records:
        return None
    places = [place_of(r) for r in dump.ranks]
    where = {p.global_rank: p.place for p in places if p.known and not p.collective}
    waiting = {p.global_rank for p in places if p.collective}
    cv = collective_verdict(dump.records, where, waiting)
    if cv is None:
        return None
    ranks = tuple(rank_collective(r) for r in dump.records)
    # A verdict made from more than the records (a second look, the stacks) is not listed
    # beside groups judged from the records alone, which would say otherwise.
    groups = () if cv.kind in SEES_MORE else _groups(answers)
    return CollectiveVerdictFound(attempt, cv.text, cv.kind, cv.odd, ranks, path, groups)


def _groups(answers: dict[int, Answer]) -> tuple[FrGroup, ...]:
    """Each process group that waits, judged by ``tuilaunch why``'s judge from the ranks' raw
    records (what ``flightrec/rank<N>.json`` keeps); none when a record cannot be read."""
    found = frdump.DumpSet("")
    try:
        for g, a in answers.items():
            fr = a.raw.get("fr") if a.raw is not None else None
            if isinstance(fr, dict) and "entries" in fr:
                found.dumps[g] = frdump.dump_from_dict(g, "", fr)
        return frjudge.judge(found).group_records() if found.dumps else ()
    except (frdump.BadDump, ValueError, TypeError, KeyError):
        return ()


def _save_records(directory: str, answers: dict[int, Answer], attempt: int) -> None:
    """Each rank's raw answer under ``flightrec/``: its Flight Recorder as torch dumped it
    (``rank<N>.json``) and as torch's analyser reads it (``<host>.attempt<A>.rank_<N>``, a
    pickle: ``torchfrtrace <dump>/flightrec`` reads the rank's file without being told more)."""
    raw = {g: a.raw for g, a in answers.items() if a.raw is not None}
    if not raw:
        return
    os.makedirs(dump_records_dir(directory), mode=0o700, exist_ok=True)
    host = socket.gethostname()
    for g, data in raw.items():
        fr = data.get("fr")
        with open(dump_record(directory, g), "w") as fp:
            json.dump(fr or {"error": data.get("fr_error")}, fp)
        if isinstance(fr, dict) and "entries" in fr:
            with open(dump_analyser_record(directory, host, attempt, g), "wb") as fp:
                pickle.dump(analyser_record(fr), fp)
