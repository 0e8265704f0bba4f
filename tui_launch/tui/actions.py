"""The dashboard's actions, declared once: keys, footer labels, help, palette, when each applies.

:data:`ACTIONS` is the one list every key of the dashboard comes from. The app's ``BINDINGS``
(:func:`bindings`), the help screen's rows (:func:`help_rows`), the command palette's entries
(:func:`palette`) and the rule that hides what does not apply (:func:`applies`, used by
``check_action``) are all generated from it, and a test checks the README's key table against
it. Adding a key means adding one :class:`Action` here and its ``action_<name>`` method: on the
app when it changes the view, on :class:`~tui_launch.tui.commands.RunCommands` when it acts on
the run, on a :class:`~tui_launch.tui.mode.Mode` when only that mode has it (the replay cursor's).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from textual.binding import Binding, BindingType

from tui_launch.core.model.store import LIVE_STATES, Phase, Snapshot


class Needs(Enum):
    """When an action applies (otherwise its key is hidden and does nothing)."""

    NOTHING = "always"
    RANK = "a selected rank"
    LIVE_RANK = "a selected rank that runs or is stopped, in a run not finished"
    RUNNING = "running workers, in a run not finished"
    FILTER = "a log filter applied"  # the app answers this one (the filter is UI state)
    REPLAY = "a replay (tuilaunch replay)"
    LIVE = "a run not finished"


# Needs that act on a live run: never in a replay or a read-only attach, whatever the
# snapshot at the cursor says (an attach --control may: its mode has ``controls``).
ACTS_ON_RUN = frozenset({Needs.LIVE_RANK, Needs.RUNNING, Needs.LIVE})


# How a person writes a key (help, README) -> Textual's name for it.
_TEXTUAL_KEY = {
    "/": "slash",
    "?": "question_mark",
    "+": "plus",
    "-": "minus",
    ".": "full_stop",
    ",": "comma",
    "[": "left_square_bracket",
    "]": "right_square_bracket",
    "Esc": "escape",
}


@dataclass(frozen=True)
class Action:
    """One thing the dashboard can be asked to do.

    ``name`` is the Textual action (the app's ``action_<name>`` method); an empty name marks a
    row that only documents keys handled elsewhere (the table's cursor, Textual's palette).
    ``keys`` are the documented keys as a person types them; ``bind`` the keys actually bound,
    when not all of ``keys`` (``enter`` on a row reaches ``rank_log`` through the table) or
    more (``ctrl+c`` also quits).
    """

    name: str
    keys: tuple[str, ...]
    help: str
    label: str = ""  # the footer's label
    tooltip: str = ""
    binding_id: str = ""
    bind: tuple[str, ...] | None = None
    help_keys: str = ""  # the help screen's key column, when not the keys joined by ", "
    help_last: bool = False  # listed after every other row on the help screen
    palette: str = ""  # the command palette's title; empty: not in the palette
    palette_help: str = ""
    needs: Needs = Needs.NOTHING
    destructive: bool = False  # asks y/n first (unless --no-confirm)
    footer: bool = True  # shown in the footer (when it applies)

    @property
    def bound_keys(self) -> tuple[str, ...]:
        """The keys bound to the action, in Textual's names."""
        keys = self.keys if self.bind is None else self.bind
        return tuple(_TEXTUAL_KEY.get(k, k) for k in keys)

    @property
    def help_label(self) -> str:
        """The key column of the help screen."""
        return self.help_keys or ", ".join(self.keys)


ACTIONS: tuple[Action, ...] = (
    Action("", ("up", "down"), "select a rank (mouse works too)", help_keys="up/down"),
    Action(
        "kill",
        ("k",),
        "kill the selected rank (SIGKILL)",
        label="Kill",
        tooltip="SIGKILL the selected rank",
        binding_id="kill",
        palette="Kill the selected rank",
        palette_help="SIGKILL the selected rank",
        needs=Needs.LIVE_RANK,
        destructive=True,
    ),
    Action(
        "term",
        ("t",),
        "terminate the selected rank (SIGTERM)",
        label="SIGTERM",
        tooltip="SIGTERM the selected rank",
        binding_id="term",
        palette="Terminate the selected rank",
        palette_help="SIGTERM the selected rank",
        needs=Needs.LIVE_RANK,
        destructive=True,
    ),
    Action(
        "stop_continue",
        ("s",),
        "stop / continue the selected rank (SIGSTOP / SIGCONT)",
        label="Stop/Cont",
        tooltip="SIGSTOP or SIGCONT the rank",
        binding_id="stop",
        palette="Stop / continue the selected rank",
        palette_help="SIGSTOP or SIGCONT",
        needs=Needs.LIVE_RANK,
        destructive=True,
    ),
    Action(
        "restart",
        ("r",),
        "restart the whole worker group (spends no failure budget)",
        label="Restart",
        tooltip="Restart the worker group (no budget spent)",
        binding_id="restart",
        palette="Restart the worker group",
        palette_help="no failure budget spent",
        needs=Needs.RUNNING,
        destructive=True,
    ),
    Action(
        "inject",
        ("i",),
        "inject a failure: kill, hang, slow, exit, exception, node",
        label="Inject",
        tooltip="Inject a failure into the selected rank",
        binding_id="inject",
        palette="Inject a failure into the selected rank",
        palette_help="kill, hang, slow, exit, exception, node",
        needs=Needs.LIVE_RANK,
    ),
    Action(
        "rank_log",
        ("l", "enter"),
        "show the selected rank's log",
        label="Rank log",
        tooltip="Show the selected rank's log",
        binding_id="log",
        bind=("l",),
        palette="Show the selected rank's log",
        palette_help="its stdout and stderr; the view follows the selection",
        needs=Needs.RANK,
    ),
    Action(
        "merged_log",
        ("a",),
        "show all ranks' logs, merged",
        label="All logs",
        tooltip="All ranks' logs, merged",
        binding_id="merged",
        palette="Show all ranks' logs, merged",
        palette_help="every line tagged with its rank",
    ),
    Action(
        "filter",
        ("/",),
        "filter log lines by text",
        label="Filter",
        tooltip="Filter log lines by text",
        binding_id="filter",
    ),
    Action(
        "clear_filter",
        ("Esc",),
        "clear an applied log filter",
        label="Clear filter",
        tooltip="Show every log line again",
        binding_id="clear_filter",
        palette="Clear the log filter",
        palette_help="show every log line again",
        needs=Needs.FILTER,
    ),
    Action(
        "follow",
        ("f",),
        "follow new log lines",
        label="Follow",
        tooltip="Follow new log lines",
        binding_id="follow",
    ),
    Action(
        "streams",
        ("e",),
        "cycle streams: both / stdout / stderr",
        label="Streams",
        tooltip="stdout+stderr / stdout / stderr",
        binding_id="streams",
    ),
    Action(
        "root_cause",
        ("c",),
        "show the root cause",
        label="Root cause",
        tooltip="Show the root-cause tab",
        binding_id="cause",
        palette="Show the root cause",
        palette_help="the first failure: exit, signal, traceback, stderr",
    ),
    Action(
        "dump_stacks",
        ("d",),
        "dump every rank's stacks on this node (the Stacks tab)",
        label="Stacks",
        tooltip="Dump every rank's stacks (py-spy) and show them",
        binding_id="stacks",
        palette="Dump every rank's stacks",
        palette_help="where is each rank? which one is the odd one out?",
        needs=Needs.RUNNING,
    ),
    Action(
        "cluster",
        ("n",),
        "show every node of the job (the cluster tab)",
        label="Cluster",
        tooltip="Every node of the job",
        binding_id="cluster",
        palette="Show the cluster tab",
        palette_help="every node of the job",
    ),
    Action(
        "agent_log",
        ("o",),
        "show the agent log: torch's own messages",
        label="Agent log",
        tooltip="torch's own messages",
        binding_id="agentlog",
        palette="Show the agent log",
        palette_help="torch's own messages: rendezvous, store, agent",
    ),
    Action(
        "replay_play",
        ("space",),
        "replay: play / pause",
        label="Play/Pause",
        tooltip="Play or pause the replay",
        needs=Needs.REPLAY,
    ),
    Action(
        "replay_faster",
        ("+",),
        "replay: play faster (x2)",
        label="Faster",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "replay_slower",
        ("-",),
        "replay: play slower (/2)",
        label="Slower",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "replay_step",
        (".",),
        "replay: one event forward",
        label="Step",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "replay_back",
        (",",),
        "replay: one event back",
        label="Back",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "replay_next",
        ("]",),
        "replay: jump to the next failure, restart or injection (a hang, a kill)",
        label="Next",
        tooltip="Next failure, restart or injection",
        needs=Needs.REPLAY,
    ),
    Action(
        "replay_previous",
        ("[",),
        "replay: jump to the previous failure, restart or injection",
        label="Prev",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "replay_start",
        ("g",),
        "replay: go to the start",
        label="Start",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "replay_end",
        ("G",),
        "replay: go to the end",
        label="End",
        needs=Needs.REPLAY,
        footer=False,
    ),
    Action(
        "detach",
        ("D",),
        "detach: the job goes on without this terminal",
        label="Detach",
        tooltip="Leave the job running without this terminal",
        binding_id="detach",
        palette="Detach: leave the job running in the background",
        palette_help="its console output goes to console.log in the run directory",
        needs=Needs.LIVE,
        footer=False,
    ),
    Action("", ("ctrl+p",), "command palette"),
    Action("help", ("?",), "this help", label="Help", binding_id="help", help_last=True),
    Action(
        "quit_job",
        ("q",),
        "quit (stops the job if it runs)",
        label="Quit",
        tooltip="Stop the job and quit",
        binding_id="quit",
        bind=("q", "ctrl+c"),
        palette="Stop the job and quit",
        palette_help="SIGTERM to the workers (SIGKILL after the timeout), then the summary",
        destructive=True,  # while the workers run
    ),
)

BY_NAME = {a.name: a for a in ACTIONS if a.name}


def bindings() -> list[BindingType]:
    """The app's ``BINDINGS``, in the table's order (the footer's order)."""
    return [
        Binding(
            ",".join(a.bound_keys),
            a.name,
            a.label,
            show=a.footer,
            tooltip=a.tooltip,
            id=a.binding_id or a.name,
        )
        for a in ACTIONS
        if a.name and a.bound_keys
    ]


def help_rows(replay: bool = False) -> list[tuple[str, str]]:
    """The help screen's rows: (keys, what they do); the replay keys only in a replay."""
    rows = sorted(ACTIONS, key=lambda a: a.help_last)  # stable: the table's order otherwise
    return [(a.help_label, a.help) for a in rows if replay or a.needs is not Needs.REPLAY]


def palette() -> Iterator[Action]:
    """The actions offered in the command palette, in the table's order."""
    return (a for a in ACTIONS if a.palette)


def applies(
    needs: Needs, snap: Snapshot, rank: int | None, replay: bool = False, controls: bool = False
) -> bool:
    """Whether an action that ``needs`` this applies to ``snap`` with ``rank`` selected
    (``replay``: in a replay, where nothing acts on the run and the replay keys work;
    ``controls``: an ``attach --control``, a replay of a live run that may act on it)."""
    if needs is Needs.NOTHING:
        return True
    if needs is Needs.REPLAY:
        return replay
    if replay and needs in ACTS_ON_RUN and not controls:
        return False
    if needs is Needs.RANK:
        return rank is not None
    finished = snap.finished is not None
    if needs is Needs.LIVE:
        return not finished
    if needs is Needs.RUNNING:
        return not finished and snap.phase == Phase.RUNNING
    row = snap.rank(rank) if rank is not None else None
    return not finished and row is not None and row.state in LIVE_STATES
