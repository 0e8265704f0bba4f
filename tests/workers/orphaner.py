"""Test worker: starts a child that ignores SIGTERM (and, with ``setsid``, leaves the session).

Usage: ``orphaner.py DIR MODE THEN`` where MODE is ``term`` (the child ignores SIGTERM) or
``setsid`` (it also calls ``setsid()``: a new session and process group, out of reach of a
signal to the worker's group), and THEN is ``exit`` (the worker exits 0 once the child is up)
or ``sleep`` (it sleeps until killed). The child writes its pid to ``DIR/child_<rank>`` once its
SIGTERM handler is set, then sleeps.
"""

import os
import subprocess
import sys
import time

out, mode, then = sys.argv[1], sys.argv[2], sys.argv[3]
rank = os.environ.get("RANK", "0")
path = os.path.join(out, f"child_{rank}")
child = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    f"if {mode == 'setsid'!r}: os.setsid()\n"
    "tmp = sys.argv[1] + '.tmp'\n"
    "open(tmp, 'w').write(str(os.getpid())); os.rename(tmp, sys.argv[1])\n"
    "time.sleep(600)\n"
)
subprocess.Popen([sys.executable, "-c", child, path])
deadline = time.monotonic() + 60
while not os.path.exists(path) and time.monotonic() < deadline:
    time.sleep(0.02)
print(f"rank {rank}: child up", flush=True)
if then == "sleep":
    time.sleep(600)
