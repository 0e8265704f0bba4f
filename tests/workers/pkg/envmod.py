"""Test worker run as a module (``-m pkg.envmod OUT_DIR [ARGS...]``): dump env and argv.

Writes ``OUT_DIR/env_<RANK>.json`` holding ``{"env": {...}, "argv": [...]}`` like
``env_dump.py``, but imports nothing heavy, so a launch stays cheap.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    payload = json.dumps({"env": dict(os.environ), "argv": sys.argv}, sort_keys=True)
    tmp = out_dir / f".env_{rank}.json.tmp"
    tmp.write_text(payload)
    tmp.replace(out_dir / f"env_{rank}.json")


if __name__ == "__main__":
    main()
