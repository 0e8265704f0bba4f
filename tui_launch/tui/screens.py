"""Modal screens: the y/n confirmation for destructive keys, and the help screen."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


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
        width = max(len(k) for k, _ in self.rows) + 2
        text = "\n".join(f"{k.ljust(width)}{desc}" for k, desc in self.rows)
        with Vertical(id="help-box"):
            yield Static("tuilaunch keys", id="help-title")
            yield Static(text, id="help-text")
            yield Static(
                "Destructive keys ask y/n unless --no-confirm.  Esc closes.", id="help-foot"
            )

    def action_close(self) -> None:
        self.dismiss(None)
