"""The launch's command line: what a user typed, parsed, checked, and handed to the run.

Below :mod:`tui_launch.core.run`, which builds its configuration from these options (and takes
its defaults from them) and reads torchrun's arguments through one typed record; nothing here
knows a run exists.

- ``options``: tuilaunch's options, each declared once: a field of ``Options`` with its flag,
  default, help, choices and check.
- ``args``: tuilaunch's command line: torchrun's own parser plus tuilaunch's options.
- ``torchrun``: ``TorchrunArgs``: what tuilaunch reads of torchrun's namespace, read once.
- ``validate``: checks of the command line that torchrun would only make after starting.
- ``slurm``: a Slurm allocation read from the environment, as the rendezvous options it implies.
- ``signals``: signal names on the command line (``--preempt-signals``) as signals.
- ``demo``: ``--demo``'s trainer, its length and the failure it injects.
"""
