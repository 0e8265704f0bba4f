"""A run's state for scripts and agents: ``tuilaunch status`` and the MCP server read it here.

:func:`resolve` turns what a user typed (a run id, a launcher pid, a run directory, a journal,
or nothing) into a :class:`Target`: the journal, the run index entry when there is one, and
whether the run is live. :func:`status` reads the run's state as one JSON-ready dict whose
shape is versioned (:data:`SCHEMA_VERSION`; the JSON Schema is ``docs/status.schema.json``,
documented in ``docs/scripting.md``).

Where the state comes from: the journal, always (the launcher writes each event with one
unbuffered ``write``, so a running run's journal is as fresh as its last event), folded with
:func:`~tui_launch.core.journal.recent.recent_snapshot` (the old telemetry records skipped:
what is read here does not depend on them). A live run that listens on a control socket is
also asked for its ``status`` over a read-only connection, which adds what the journal holds
only every few seconds: each rank's latest step and rate. A socket that does not answer costs
nothing but its timeout (:data:`SOCKET_TIMEOUT`); the journal's state stands.

Pure reading: nothing here acts on a run, and a read-only connection cannot.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from tui_launch.core.diagnosis import frdump, frjudge
from tui_launch.core.diagnosis.stacks.save import verdict_that_sees_more
from tui_launch.core.journal.recent import recent_snapshot
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model.events import Failure, RankProgress
from tui_launch.core.model.layout import journal_of, run_dir_of
from tui_launch.core.model.progress import PROGRESS_FIELDS
from tui_launch.core.model.redact import redact_args
from tui_launch.core.model.store import RankState, Snapshot
from tui_launch.core.remote import runindex
from tui_launch.core.remote.controlsock import ControlClient, ControlError

SCHEMA_VERSION = 1
SOCKET_TIMEOUT = 0.25  # status must answer within half a second, whatever the run does
# A rank's state when the journal cannot say: its launcher was killed (``lost``, as the run),
# or the journal stopped before the run's end (``unknown``).
LOST, UNKNOWN = "lost", "unknown"
ALIVE = frozenset({RankState.STARTING, RankState.RUNNING, RankState.STOPPED, RankState.RESTARTING})


class NoSuchRun(Exception):
    """``RUN`` names no run of this user here (a one-line reason)."""


@dataclass(frozen=True)
class Target:
    """A run that ``RUN`` named: its journal, its index entry (None: a run directory or
    journal given by path that the index no longer lists) and whether it is live."""

    journal: str
    entry: runindex.Entry | None
    live: bool

    @property
    def run_dir(self) -> str:
        """The run directory (the journal's)."""
        return self.entry.run_dir if self.entry and self.entry.run_dir else _dir(self.journal)


def _dir(journal: str) -> str:
    return run_dir_of(os.path.abspath(journal))


def resolve(target: str | None, live_only: bool = False) -> Target:
    """The run ``target`` names, as ``attach`` reads it: a run directory or a journal file, a
    launcher pid or a run id (live runs first, then ended ones, newest first); None: the only
    live run, else the latest started live run, else (unless ``live_only``) the latest ended
    one. ``live_only`` (``ctl``): a live run, whose journal need not be readable yet (its
    ``journal`` may then be empty). NoSuchRun with a one-line reason."""
    try:
        found = runindex.sweep(runindex.entries())  # stale runs go, whatever is asked
    except runindex.UnsafeIndexDir as unsafe:
        raise NoSuchRun(str(unsafe)) from None
    live = [e for e in found if runindex.state(e) == runindex.LIVE]
    ended = [] if live_only else [e for e in found if e.ended is not None]
    if target is not None and _exists(target):
        path = os.path.abspath(target)
        journal = journal_of(path)
        if not _exists(journal):
            raise NoSuchRun(f"no journal at {journal}")
        _check_readable(journal)
        for e in live + ended:
            if journal == e.journal or _dir(journal) == e.run_dir:
                return Target(journal, e, e in live)
        if live_only:
            raise NoSuchRun(f"no live run writes {journal}")
        return Target(journal, None, False)
    if target is not None:
        live = [e for e in live if target in (str(e.pid), e.run_id)]
        ended = [e for e in ended if target in (str(e.pid), e.run_id)]
    # A live run first (newest first), even one whose journal is not there yet: an ended
    # run must not stand in for the run that was just started.
    for e in live or ended:
        if e.journal and os.path.isfile(e.journal):
            return Target(e.journal, e, e in live)
        if live_only:
            return Target(e.journal or "", e, True)
    what = "live run" if live_only else "run"
    if live or ended:
        first = (live or ended)[0]
        raise NoSuchRun(f"run {first.pid} has no journal yet: try again in a moment")
    raise NoSuchRun(f"no {what}{'' if target is None else ' ' + repr(target)} here (tuilaunch ls)")


def _exists(path: str) -> bool:
    """Whether ``path`` exists; a path this user may not look at is said so (NoSuchRun), not
    taken for a run id or called missing."""
    try:
        os.stat(path)
    except PermissionError:
        raise NoSuchRun(f"permission denied: cannot read {os.path.abspath(path)}") from None
    except OSError:
        return False
    return True


def _check_readable(journal: str) -> None:
    """NoSuchRun (permission denied, not a file) unless ``journal`` can be opened."""
    if os.path.isdir(journal):
        raise NoSuchRun(f"{journal} is a directory, not a journal")
    try:
        os.close(os.open(journal, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
    except PermissionError:
        raise NoSuchRun(f"permission denied: cannot read {journal}") from None
    except OSError as e:
        raise NoSuchRun(f"cannot read {journal}: {e.strerror or e}") from None


# ------------------------------------------------------------------ the state


def status(target: Target, socket: bool = True, now: float | None = None) -> dict[str, Any]:
    """The run's state as ``status --json`` prints it (see ``docs/status.schema.json``);
    ``socket``: ask a live run's control socket for its latest progress too. NoSuchRun
    when the journal cannot be read or holds no event (not a tuilaunch journal)."""
    _check_readable(target.journal)
    try:
        timeline = Timeline(target.journal)
    except OSError as e:  # gone or made unreadable since resolve
        raise NoSuchRun(f"cannot read {target.journal}: {e.strerror or e}") from None
    try:
        events = len(timeline)
        snap = recent_snapshot(timeline, events)
    finally:
        timeline.close()
    if events == 0 and not target.live:
        # An empty file, /etc/passwd: nothing of a run to report (a live run's journal may
        # not have its first line yet).
        raise NoSuchRun(f"{target.journal} holds no tuilaunch event: not a run's journal")
    live_answer: dict[str, Any] | None = None
    entry = target.entry
    if socket and target.live and entry is not None and entry.control:
        try:
            answer = ControlClient(entry.control, "read", SOCKET_TIMEOUT).call("status")
            live_answer = answer if answer.get("ok") else None
        except ControlError:
            live_answer = None
    return _document(target, snap, live_answer, time.time() if now is None else now)


def _document(
    target: Target, snap: Snapshot, answer: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    entry = target.entry
    run = snap.run
    finished = snap.finished
    outcome: dict[str, Any] | None = None
    rank_end: str | None = None  # what a rank the journal last saw alive is now
    if finished is not None:
        state = finished.outcome
        outcome = {
            "outcome": finished.outcome,
            "exit_code": finished.exit_code,
            "message": finished.message,
        }
    elif not target.live and entry is not None and entry.ended is not None:
        # The launcher ended and said how in the run index, but its journal has no end (a
        # full disk under --log-dir): the index is the truth, as `ls` shows it.
        state = entry.outcome or "lost"
        outcome = {
            "outcome": state,
            "exit_code": entry.exit_code,
            "message": "from the run index: the journal's last events were not written",
        }
        rank_end = UNKNOWN
    elif not target.live:
        # No run_finished line and no live launcher: it was killed (SIGKILL, a lost node),
        # and so were, or may have been, the ranks it ran.
        state = rank_end = LOST
    else:
        state = snap.phase
    started = snap.started_wall
    if started is None and entry is not None:
        started = entry.started
    ended = entry.ended if entry and entry.ended else None
    end = ended if ended is not None else (now if target.live else _last_wall(snap))
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {
            "id": run.run_id if run else (entry.run_id if entry else None),
            "launcher_pid": run.launcher_pid if run else (entry.pid if entry else None),
            "host": run.host if run else (entry.host if entry else None),
            # Both redacted where they are written; again here for older journals and records.
            "command": list(redact_args(entry.argv)) if entry else None,
            "entrypoint": list(redact_args([run.entrypoint, *run.args])) if run else None,
            "nproc_per_node": run.nproc_per_node if run else None,
            "run_dir": target.run_dir,
            "journal": os.path.abspath(target.journal),
            "control_socket": entry.control if entry and target.live else None,
            "torch_version": run.torch_version if run else None,
        },
        "live": target.live,
        "state": state,
        "outcome": outcome,
        "started": started,
        "duration": (end - started) if started is not None and end is not None else None,
        "attempt": snap.attempt,
        "attempts": [
            {
                "number": a.number,
                "started": a.started,
                "ended": a.ended,
                "end_reason": a.end_reason,
                "world_size": a.world_size,
            }
            for a in snap.attempts
        ],
        "restarts": {
            "failure": snap.failure_restarts,
            "manual": snap.manual_restarts,
            "membership": snap.membership_restarts,
            "max": snap.max_restarts,
        },
        "ranks": _ranks(snap, answer, rank_end, now),
        "progress": _job_progress(snap, answer, now),
        "verdict": _verdict(snap),
        "flight_recorder": flight_recorder(target.run_dir),
        "root_cause": _root_cause(snap),
        "events": snap.events,
        "source": "journal+socket" if answer else "journal",
    }


def _last_wall(snap: Snapshot) -> float | None:
    if snap.finished is not None:
        return snap.finished.wall
    walls = [a.ended or a.started for a in snap.attempts]
    return max(walls) if walls else snap.started_wall


def _progress_of(
    snap: Snapshot, answer: dict[str, Any] | None, now: float
) -> dict[int, dict[str, Any]]:
    """Each global rank's latest progress: the socket's (fresher) when it answered with the
    current attempt's, else the journal's (a record every few seconds); ``age_s``: seconds
    since that reading was taken (None when the socket did not say)."""
    out: dict[int, dict[str, Any]] = {}
    if snap.progress is not None and snap.progress.latest.attempt == snap.attempt:
        age = _age(now, snap.progress.latest.wall)
        for r in snap.progress.latest.ranks:
            out[r.global_rank] = {**_rank_progress(r), "age_s": age}
    if answer and answer.get("attempt") == snap.attempt:
        wall = answer.get("progress_wall")
        read = _age(now, wall) if isinstance(wall, (int, float)) else None
        for item in answer.get("progress") or ():
            if isinstance(item, dict) and isinstance(item.get("global_rank"), int):
                p = {k: item.get(k) for k in PROGRESS_FIELDS}
                out[item["global_rank"]] = {**p, "age_s": read}
    return out


def _age(now: float, wall: float) -> float:
    return round(max(0.0, now - wall), 1)


def _rank_progress(r: RankProgress) -> dict[str, Any]:
    return {k: getattr(r, k) for k in PROGRESS_FIELDS}


def _ranks(
    snap: Snapshot, answer: dict[str, Any] | None, rank_end: str | None, now: float
) -> list[dict[str, Any]]:
    progress = _progress_of(snap, answer, now)
    stopped = set(answer.get("stopped") or ()) if answer else set()
    rows = []
    for r in snap.ranks:
        p = progress.get(r.global_rank, {})
        state: str = RankState.STOPPED if r.local_rank in stopped else r.state
        if rank_end is not None and state in ALIVE:
            state = rank_end  # the journal last saw it alive; nothing says it still is
        rows.append(
            {
                "local_rank": r.local_rank,
                "global_rank": r.global_rank,
                "pid": r.pid,
                "attempt": r.attempt,
                "state": state,
                "exit_code": r.exit_code,
                "signal": r.signal,
                "step": p.get("step"),
                "total": p.get("total"),
                "rate": p.get("rate"),
                "loss": p.get("loss"),
                "stalled": bool(p.get("stalled")),
                "age_s": p.get("age_s"),
                "hung": r.global_rank in snap.hung_ranks,
                # The collective each rank last entered: the Flight Recorder's;
                # null until a run records one.
                "last_collective": None,
            }
        )
    return rows


def _job_progress(
    snap: Snapshot, answer: dict[str, Any] | None, now: float
) -> dict[str, Any] | None:
    if snap.progress is None:
        return None
    leader = snap.progress.latest.leader
    p = _progress_of(snap, answer, now).get(leader) if leader is not None else None
    if p is None:
        return None
    return {"leader": leader, **p}


def flight_recorder(run_dir: str) -> dict[str, Any] | None:
    """``tuilaunch why``'s verdict on the run's Flight Recorder dumps (NCCL's in
    ``flightrec/``, else a stack dump's records; ``docs/why.md``), None when it has none."""
    try:
        found = frdump.load_run(run_dir)
    except (frdump.BadDump, OSError) as e:
        return {"path": run_dir, "error": str(e)}
    if not found.dumps:
        return None
    return judged(found)[0]


def judged(found: frdump.DumpSet) -> tuple[dict[str, Any], list[str]]:
    """``tuilaunch why``'s document and lines on ``found``. Where the dumps are a stack dump's
    records and that dump's own verdict was made from more than them (a second look, the
    stacks), that verdict leads (``verdict``, ``kind``, ``culprits``) and ``records_alone``
    keeps the judge's line: a run never shows "rank 1 never issued ..." from its records beside
    "ranks 0, 1 move on ...: not a hang" from the same dump."""
    v = frjudge.judge(found)
    doc: dict[str, Any] = {"path": found.path, **v.to_dict()}
    lines = v.lines()
    own = verdict_that_sees_more(found.path)
    if own is None:
        return doc, lines
    doc.update(
        verdict=own.text,
        kind=own.kind,
        culprits=[{"rank": r, "why": [own.kind], "text": own.text, "groups": []} for r in own.odd],
        records_alone=v.text,
    )
    return doc, [own.text, f"(the records alone: {v.text})", *lines[1:]]


def _verdict(snap: Snapshot) -> dict[str, Any] | None:
    """The latest hang verdict of the run, else the latest stack dump's."""
    if snap.hang is not None:
        h = snap.hang
        return {
            "source": "hang",
            "attempt": h.attempt,
            "text": h.verdict,
            "confirmation": h.confirmation,
            "odd_ranks": list(h.odd_ranks),
            "still_ranks": list(h.still_ranks),
            "cleared": snap.hang_cleared is not None,
            "action": h.action,
            "stacks": h.second_path,
        }
    if snap.dumps:
        d = snap.dumps[-1]
        return {
            "source": "dump",
            "attempt": d.attempt,
            "text": d.verdict,
            "confirmation": None,
            "odd_ranks": list(d.odd_ranks),
            "still_ranks": [],
            "cleared": False,
            "action": None,
            "stacks": d.path,
        }
    return None


def _root_cause(snap: Snapshot) -> dict[str, Any] | None:
    f: Failure | None = snap.root_cause
    if f is None:
        return None
    from tui_launch.core.model.store import recovered

    return {
        "attempt": f.attempt,
        "global_rank": f.global_rank,
        "local_rank": f.local_rank,
        "host": f.host,
        "pid": f.pid,
        "exit_code": f.exit_code,
        "signal": f.signal,
        "message": f.message,
        "hint": f.hint,
        "traceback": f.traceback,
        "hung": f.hung,
        "recovered": recovered(snap, f),
    }


# ------------------------------------------------------------------ in words


def text(doc: dict[str, Any]) -> str:
    """``status`` without ``--json``: the same document, for a person."""
    run = doc["run"]
    lines = [
        f"run {run['id']}  launcher pid {run['launcher_pid']}  {doc['state']}"
        + ("" if doc["live"] else " (not live)"),
        f"  dir: {run['run_dir']}",
    ]
    r = doc["restarts"]
    when = f"  attempt {doc['attempt']}, restarts: {r['failure']} / {r['max']} on failure"
    when += f", {r['manual']} manual, {r['membership']} membership"
    if doc["duration"] is not None:
        when += f", {_fmt_seconds(doc['duration'])}"
    lines.append(when)
    if doc["outcome"]:
        o = doc["outcome"]
        lines.append(f"  outcome: {o['outcome']} (exit {o['exit_code']}) {o['message']}".rstrip())
    p = doc["progress"]
    if p:
        step = f"{p['step']}" + (f"/{p['total']}" if p["total"] else "")
        rate = f", {p['rate']:.3g} steps/s" if p["rate"] else ""
        when = _fmt_age(p.get("age_s"))
        lines.append(
            f"  progress: step {step}{rate} (rank {p['leader']}{', ' + when if when else ''})"
        )
    lines.append("  RANK  LOCAL  PID      STATE       STEP      RATE      AGE")
    for k in doc["ranks"]:
        state = k["state"] + (" (hung)" if k["hung"] else "")
        step = "-" if k["step"] is None else str(k["step"])
        rate = "-" if k["rate"] is None else f"{k['rate']:.3g}/s"
        when = (_fmt_age(k.get("age_s")) or "-") if k["step"] is not None else "-"
        lines.append(
            f"  {k['global_rank']:<4}  {k['local_rank']:<5}  {k['pid']:<7}  {state:<10}  "
            f"{step:<8}  {rate:<8}  {when}"
        )
    c = doc["root_cause"]
    if c:
        how = f"signal {c['signal']}" if c["signal"] else f"exit {c['exit_code']}"
        tail = " (recovered)" if c["recovered"] else ""
        lines.append(f"  root cause: rank {c['global_rank']} ({how}): {c['message']}{tail}")
    v = doc["verdict"]
    if v:
        lines.append(f"  verdict ({v['source']}): {v['text']}")
    fr = doc.get("flight_recorder")
    if fr:
        lines.append(f"  flight recorder: {fr.get('verdict') or fr.get('error')}")
    return "\n".join(lines)


def _fmt_age(age: float | None) -> str:
    """How old a progress reading is: ``12 s ago``, ``3m05s ago``; empty when unknown."""
    if age is None:
        return ""
    return f"{int(age)} s ago" if age < 60 else f"{_fmt_seconds(age)} ago"


def _fmt_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
