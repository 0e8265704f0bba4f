"""The base of the model's vocabularies: a word that is its own string.

Phases, rank states, failure classes, GPU states, restart policies and exit-code styles are
:class:`Word` enums, as torch elastic's ``WorkerState`` is a ``(str, Enum)``: a closed set a
test can go through member by member, whose values are the very strings the journal, the
status JSON and the metrics have always carried. A member *is* its string (``==``, ``hash``,
``str()``, f-strings and ``json.dumps`` all give the value), so an event written with a member
reads back from a journal as the plain string and nothing downstream can tell them apart.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A ``(str, Enum)`` whose ``str()`` and ``format()`` are its value on every Python.

    Python 3.11 formats a mixed-in enum as ``Class.NAME``; the text, the metrics' labels and
    messages such as ``f"agent is {phase}"`` must keep the bare word.
    """

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


__all__ = ["Word"]
