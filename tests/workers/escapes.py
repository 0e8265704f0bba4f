"""Test worker: prints terminal escape sequences, as a misbehaving program might.

Every half second (``--forever``) or once, on stdout and stderr: an OSC title change
(``ESC ] 0 ; ... BEL`` and ``ESC ] 2 ; ... ESC \\``), a cursor move (``ESC [ 5 ; 5 H``), a clear
screen (``ESC [ 2 J``), a bell and an SGR colour. Without ``--forever`` it then raises an
exception whose message holds an escape too (the root cause shows it). No torch: nothing
here needs a process group.
"""

from __future__ import annotations

import sys
import time

TITLE = "\x1b]0;pwned-title\x07"
TITLE_ST = "\x1b]2;pwned-st\x1b\\"
MOVE = "\x1b[5;5Hmoved"
CLEAR = "\x1b[2J\x1b[H"
BELL = "\a"
SGR = "\x1b[31mred\x1b[0m"


def emit(n: int) -> None:
    line = f"escapes {n}: {TITLE}{TITLE_ST} {MOVE} {CLEAR}{BELL} {SGR} end"
    print(line, flush=True)
    print(f"err {line}", file=sys.stderr, flush=True)


def main() -> None:
    forever = "--forever" in sys.argv
    n = 0
    while True:
        emit(n)
        n += 1
        if not forever:
            raise RuntimeError(f"boom {TITLE}{CLEAR} after escapes")
        time.sleep(0.5)


if __name__ == "__main__":
    main()
