"""The injected exception is held out of torch's code, its imports included.

torch catches and converts exceptions in its own Python code (``except RuntimeError: raise
AttributeError(...) from None`` in its op tables), so an ``exception`` injection must not be
raised there, not even when it has waited long enough to be raised "wherever the main thread
is". These tests put a stand-in ``torch`` package first on the path of a real worker process:
its code converts every exception the way torch's does and runs long enough for the hold to
time out several times, once while it is imported and once when the program calls it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKE_TORCH = '''
import os, time

def busy(seconds):
    """Python code of "torch" that converts whatever is raised in it, as torch's op lookups do.

    The injection's signal is sent from here, so that it lands in torch's code: Python runs
    the handler at the next bytecode of the main thread, which is still this function's.
    """
    from tui_launch.core.workers import shim

    os.kill(os.getpid(), shim.INJECT_SIGNAL)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            pass
    except Exception:
        raise AttributeError("The underlying op has no overload name 'Scalar'") from None
'''

PROGRAM = """
import json, os, sys
from tui_launch.core.workers import shim

shim.HOLD_AT_MOST = 0.1  # the hold times out many times during the 1.5 s in "torch"
orders = sys.argv[1]
shim.install(orders)
import torch

def order():
    with open(os.path.join(orders, f"{os.getpid()}.json"), "w") as fp:
        json.dump({"kind": "exception", "message": "boom"}, fp)

order()
if sys.argv[2] == "import":
    import torch.slow_import  # busy for 1.5 s while being imported
else:
    torch.busy(1.5)
print("the program's next line")
"""

SLOW_IMPORT = """
from torch import busy

busy(1.5)
"""


def _run(tmp_path: Path, where: str) -> subprocess.CompletedProcess[str]:
    torch_dir = tmp_path / "site" / "torch"
    torch_dir.mkdir(parents=True)
    (torch_dir / "__init__.py").write_text(textwrap.dedent(FAKE_TORCH))
    (torch_dir / "slow_import.py").write_text(textwrap.dedent(SLOW_IMPORT))
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM))
    orders = tmp_path / "orders"
    orders.mkdir()
    root = Path(__file__).resolve().parent.parent
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{root}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(program), str(orders), where],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _last_frame(stderr: str) -> str:
    """The innermost frame of the traceback that is not the shim's own (its ``raise``)."""
    frames = [line for line in stderr.splitlines() if line.lstrip().startswith('File "')]
    theirs = [line for line in frames if "tui_launch" not in line]
    return theirs[-1] if theirs else ""


@pytest.mark.parametrize("where", ["import", "call"])
def test_the_exception_waits_out_torchs_code(tmp_path, where):
    """``import``: the signal lands while a module of torch's is imported; ``call``: while the
    program calls into torch's code. Either way it surfaces at the program's next line."""
    done = _run(tmp_path, where)
    assert done.returncode == 1, done.stderr
    assert done.stderr.rstrip().endswith("InjectedFailure: boom"), done.stderr
    assert "no overload name" not in done.stderr, done.stderr
    # raised at the program's line after the import or the call, not inside torch's code
    assert "program.py" in _last_frame(done.stderr), done.stderr
    assert "the program's next line" not in done.stdout
