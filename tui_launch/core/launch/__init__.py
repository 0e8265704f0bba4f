"""The launch's command line: what a user typed, parsed, checked, and handed to the run.

Below :mod:`tui_launch.core.run`, which builds its configuration from these options; nothing
here knows a run exists.

- ``args``: tuilaunch's command line: torchrun's own parser plus tuilaunch's options.
- ``validate``: checks of the command line that torchrun would only make after starting.
- ``slurm``: a Slurm allocation read from the environment, as the rendezvous options it implies.
- ``signals``: signal names on the command line (``--preempt-signals``) as signals.
- ``demo``: ``--demo``'s trainer, its length and the failure it injects.
"""
