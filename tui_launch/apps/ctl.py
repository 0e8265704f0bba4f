"""``tuilaunch ctl RUN VERB [SPEC] [--rank N]``: act on a running job from a script.

The same commands as the keys of ``attach --control`` (:mod:`tui_launch.core.model.commands`:
no verb is defined twice), sent over the run's control socket with the same checks both ways
(:mod:`tui_launch.core.remote.controlsock`) and journaled the same way, with the client's pid
and uid read by the launcher from ``SO_PEERCRED`` (source ``ctl pid N uid M``):

- ``kill``, ``term``, ``stop``, ``cont`` ``--rank N``: SIGKILL, SIGTERM, SIGSTOP, SIGCONT to
  local rank N (:class:`~tui_launch.core.model.commands.SignalRank`); ``term`` and ``kill``
  without ``--rank`` stop the whole job (:class:`~tui_launch.core.model.commands.StopRun`, as
  ``q`` in its dashboard; the launcher then exits as after that signal);
- ``restart``: restart the local worker group without spending the failure budget;
- ``dump``: dump every live rank's stacks (prints the verdict and the dump's directory);
- ``inject SPEC``: schedule an ``--inject`` spec now (checked here first).

One line on stdout when done, one line on stderr otherwise; the exit status says which
(:mod:`tui_launch.apps.status`: 0 done, 1 refused, 2 bad usage, 3 no such live run, 4 the run
does not listen for control or did not answer).
"""

from __future__ import annotations

import signal
import sys

from tui_launch.apps.status import NO_RUN, OK, REFUSED, UNREACHABLE, USAGE
from tui_launch.core.model.commands import (
    Command,
    DumpStacks,
    Inject,
    Restart,
    SignalRank,
    StopRun,
)

RANK_SIGNALS = {
    "kill": signal.SIGKILL,
    "term": signal.SIGTERM,
    "stop": signal.SIGSTOP,
    "cont": signal.SIGCONT,
}
WHOLE_JOB = ("kill", "term")  # without --rank: stop the whole job with that signal
VERBS = (*RANK_SIGNALS, "restart", "dump", "inject")
USAGE_LINE = "usage: tuilaunch ctl RUN kill|term|stop|cont --rank N | restart | dump | inject SPEC"
HELP = f"""{USAGE_LINE}

Act on a running job of this user over its control socket (the run must listen: started
with --control-socket or --detach, or D pressed in its dashboard). RUN: a run id, a launcher
pid or a run directory (tuilaunch ls). N is a local rank (status's local_rank).

  kill|term|stop|cont --rank N   SIGKILL, SIGTERM, SIGSTOP, SIGCONT to local rank N
  term|kill                      stop the whole job (as q in its dashboard)
  restart                        restart the worker group (no failure budget spent)
  dump                           dump every rank's stacks; prints the verdict
  inject SPEC                    schedule an --inject spec now (e.g. exit:rank=1,after=5s)

Exit status: 0 done, 1 refused, 2 bad usage, 3 no such live run, 4 the run does not listen
for control or did not answer."""


class Usage(ValueError):
    """Bad usage, in one line."""


def parse(argv: list[str]) -> tuple[str, Command]:
    """``(RUN, the command)`` from ctl's arguments; Usage with a one-line reason."""
    rank: int | None = None
    words: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--rank" or arg.startswith("--rank="):
            value = arg.partition("=")[2] if "=" in arg else (rest.pop(0) if rest else "")
            if not value.isdigit():
                raise Usage(f"--rank needs a local rank (0, 1, ...), got {value!r}")
            rank = int(value)
        elif arg.startswith("-"):
            raise Usage(f"unexpected option {arg!r}")
        else:
            words.append(arg)
    if len(words) < 2:
        raise Usage("a run and a verb are needed")
    target, verb, *extra = words
    if verb not in VERBS:
        raise Usage(f"unknown verb {verb!r} (one of {', '.join(VERBS)})")
    if verb == "inject":
        if len(extra) != 1:
            raise Usage("inject needs one SPEC (e.g. exit:rank=1,after=5s)")
        from tui_launch.core.run.inject import InjectError, parse_spec

        try:
            parse_spec(extra[0])
        except InjectError as e:
            raise Usage(f"bad inject spec: {e}") from None
        return target, Inject(extra[0], source="ctl")
    if extra:
        raise Usage(f"unexpected argument {extra[0]!r}")
    if verb in RANK_SIGNALS:
        if rank is not None:
            return target, SignalRank(rank, int(RANK_SIGNALS[verb]), source="ctl")
        if verb in WHOLE_JOB:  # the whole job, as q in its dashboard (kill: no grace)
            return target, StopRun(int(RANK_SIGNALS[verb]), source="ctl")
        raise Usage(f"{verb} needs --rank N")
    if rank is not None:
        raise Usage(f"{verb} acts on the whole group: no --rank")
    return target, (Restart(source="ctl") if verb == "restart" else DumpStacks(source="ctl"))


def send(target: str, cmd: Command, client: str = "ctl") -> tuple[int, str]:
    """Send ``cmd`` to the live run ``target`` names, as ``client`` (``ctl``, ``mcp``): the
    exit status (above) and one line, what was done or why not."""
    from tui_launch.core.remote.controlsock import ControlClient, ControlError
    from tui_launch.core.remote.status import NoSuchRun, resolve

    try:
        run = resolve(target, live_only=True)
    except NoSuchRun as e:
        return NO_RUN, str(e)
    entry = run.entry
    if entry is None or not entry.control:
        pid = entry.pid if entry else target
        return UNREACHABLE, (
            f"run {pid} does not listen for control: start it with --control-socket "
            "(or --detach, or press D in its dashboard)"
        )
    try:
        outcome = ControlClient(entry.control, "control", client=client).send(cmd)
    except ControlError as e:
        return (REFUSED if "refus" in str(e) else UNREACHABLE), str(e)
    if not outcome.ok:
        return REFUSED, f"refused: {outcome.detail}"
    if outcome.dump is not None:
        return OK, f"{outcome.dump.verdict} (stacks: {outcome.dump.path})"
    return OK, outcome.detail or f"{cmd.kind}: done"


def main(argv: list[str]) -> int:
    """``tuilaunch ctl``: send one command to a running job (exit statuses above)."""
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return OK if argv else USAGE
    try:
        target, cmd = parse(argv)
    except Usage as e:
        print(f"tuilaunch ctl: error: {e} ({USAGE_LINE})", file=sys.stderr)
        return USAGE
    code, line = send(target, cmd)
    if code == OK:
        print(line)
    elif code == REFUSED and line.startswith("refused: "):
        print(f"tuilaunch ctl: {line}", file=sys.stderr)
    else:
        print(f"tuilaunch ctl: error: {line}", file=sys.stderr)
    return code
