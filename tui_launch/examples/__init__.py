"""Programs that ship with tuilaunch.

- ``train_ddp``: the fault-tolerant DDP trainer (CPU, gloo) that ``--demo`` runs: resumes from
  its run's own snapshot after a restart.
"""
