"""Reaching a run from outside: the control socket, the run index, detach."""
