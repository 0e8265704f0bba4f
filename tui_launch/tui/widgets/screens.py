"""Modal screens: the y/n confirmation for destructive keys, the help screen, the inject menu."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, OptionList, Static
from textual.widgets.option_list import Option


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True for yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm-yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm-no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class HelpScreen(ModalScreen[None]):
    """Every key of the dashboard and what it does."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help-close")]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        # Two columns: a description too long for one line wraps under itself, not under the
        # keys. The rows scroll when the terminal is shorter than the list (24 lines).
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1)
        for keys, desc in self.rows:
            grid.add_row(Text(keys), Text(desc))  # as written: "[" and "]" are keys, not markup
        with Vertical(id="help-box"):
            yield Static("tuilaunch keys", id="help-title")
            with VerticalScroll(id="help-rows"):
                yield Static(grid, id="help-text")
            yield Static(
                "Destructive keys ask y/n unless --no-confirm.  Esc closes.", id="help-foot"
            )

    def on_mount(self) -> None:
        self._fit()
        self.query_one("#help-rows").focus()  # up/down, PageUp/PageDown scroll the rows

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        # The rows get what the screen leaves after the box's border, padding, title and foot
        # (10 lines): on 80x24 they scroll instead of running off the screen.
        self.query_one("#help-rows").styles.max_height = max(3, self.size.height - 10)

    def action_close(self) -> None:
        self.dismiss(None)


class InjectScreen(ModalScreen[str | None]):
    """The inject menu: pick a fault for one rank, edit its keys, inject.

    Dismisses with the full ``--inject`` spec (``kind:rank=N,key=value,...``), or None.
    Every kind of :mod:`tui_launch.core.run.inject` is listed with its keys and defaults; the spec
    is checked with the same parser as the command line before the menu closes.
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="inject-cancel")]

    # What the keys field starts with for each kind: the keys worth editing, with defaults.
    PRESETS = {
        "kill": "signal=SIGKILL",
        "hang": "for=10s",
        "slow": "duty=50,period=1s,for=30s",
        "exit": "code=1",
        "exception": "message=injected by tuilaunch",
        "node": "",
    }

    def __init__(self, who: str, global_rank: int, refusals: dict[str, str] | None = None) -> None:
        """``refusals``: the kinds this run can never inject, with why (``exit`` and
        ``exception`` without the worker bootstrap): listed greyed out, not selectable."""
        # The injection grammar is imported when the menu opens, not with the dashboard (an
        # attach or a replay waits for its first frame while the dashboard's modules load).
        from tui_launch.core.run.inject import KINDS

        super().__init__()
        self.who = who
        self.global_rank = global_rank
        self.refusals = dict(refusals or {})
        self.kind = next(k for k in KINDS if k not in self.refusals)  # kill is never refused

    def compose(self) -> ComposeResult:
        from tui_launch.core.run.inject import KIND_HELP, KINDS

        width = max(len(k) for k in KINDS) + 2
        options = [
            Option(
                f"{k.ljust(width)}{KIND_HELP[k]}"
                if k not in self.refusals
                else f"{k.ljust(width)}not in this run (see below)",
                id=k,
                disabled=k in self.refusals,
            )
            for k in KINDS
        ]
        with Vertical(id="inject-box"):
            yield Static(f"Inject a failure into {self.who}", id="inject-title")
            yield OptionList(*options, id="inject-kinds")
            refused = Static(_refused_text(self.refusals), id="inject-refused", markup=False)
            refused.display = bool(self.refusals)
            yield refused
            yield Static("", id="inject-keys-help")
            yield Input(value=self.PRESETS[self.kind], id="inject-keys")
            yield Static("", id="inject-error")
            with Horizontal(id="inject-buttons"):
                yield Button("Inject (enter)", variant="error", id="inject-go")
                yield Button("Cancel (esc)", variant="primary", id="inject-no")

    def on_mount(self) -> None:
        self.query_one("#inject-kinds", OptionList).focus()
        self._show_keys()

    def _show_keys(self) -> None:
        from tui_launch.core.run.inject import COMMON_KEYS, KIND_KEYS

        own = ", ".join(f"{k} ({v})" for k, v in KIND_KEYS[self.kind].items()) or "none"
        common = ", ".join(f"{k} ({v})" for k, v in COMMON_KEYS.items() if k != "rank")
        self.query_one("#inject-keys-help", Static).update(
            f"{self.kind} keys: {own}\nall kinds: {common}; `after` counts from now"
        )

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        from tui_launch.core.run.inject import KINDS

        kind = event.option.id or KINDS[0]
        if kind != self.kind:
            self.kind = kind
            self.query_one("#inject-keys", Input).value = self.PRESETS[kind]
            self.query_one("#inject-error", Static).update("")
            self._show_keys()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.query_one("#inject-keys", Input).focus()

    def spec(self) -> str:
        """The spec the menu currently describes."""
        keys = self.query_one("#inject-keys", Input).value.strip().strip(",")
        return f"{self.kind}:rank={self.global_rank}" + (f",{keys}" if keys else "")

    def _submit(self) -> None:
        from tui_launch.core.run.inject import InjectError, parse_spec

        spec = self.spec()
        try:
            parse_spec(spec)
        except InjectError as e:
            self.query_one("#inject-error", Static).update(str(e))
            return
        self.dismiss(spec)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "inject-go":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


def _refused_text(refusals: dict[str, str]) -> str:
    """One sentence per reason, naming every kind it holds for: ``exit`` and ``exception``
    are refused for the same reason, which the menu says once (``exit/exception injection
    needs ...``)."""
    kinds_by_reason: dict[str, list[str]] = {}
    for kind, why in refusals.items():
        kinds_by_reason.setdefault(why.replace(kind, "\0"), []).append(kind)
    return "\n".join(t.replace("\0", "/".join(k)) for t, k in kinds_by_reason.items())
