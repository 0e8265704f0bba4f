"""Blocks the main thread in a wait of the standard library's that nothing ever ends."""

import threading

print("waiting", flush=True)
try:
    threading.Event().wait()
finally:
    print("left the wait", flush=True)
