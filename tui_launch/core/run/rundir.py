"""The run directory and the log wiring: where a run's files are and who reads them.

torch decides the run directory when it first lays out an attempt's log files; tuilaunch's
:class:`~tui_launch.core.seam.logspecs.CapturingLogsSpecs` reports each layout here
(:meth:`RunFiles.on_reify`), which points the log tailer at the new files, the duplicate
filters at torch's filtered files, and the journal and agent log at the run directory. A run
that ends before torch made one (a failed rendezvous) still gets a directory of its own.
What the files below it are called is :mod:`tui_launch.core.model.layout`'s.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from tui_launch.core.fswatch import FsWatch
from tui_launch.core.journal.writer import Journal
from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.logs.sinks import AgentLogCapture, DuplicateFilter
from tui_launch.core.logs.tail import STDERR, STDOUT, LogTailer
from tui_launch.core.model.layout import run_dir_of
from tui_launch.core.progress.workerenv import worker_env_defaults
from tui_launch.core.seam.logspecs import CapturingLogsSpecs, ReifiedLogs


class RunFiles:
    """A run's directory, journal, agent log, log tailer and per-rank file paths.

    Args:
        torchrun: torchrun's arguments (``--log-dir``, ``--rdzv-id``, duplicate filters).
        journal_path: ``--journal``; default: ``journal.jsonl`` in the run directory.
        echo: whether worker output that torchrun would print goes to the console sinks.
        next_attempt: the number of the attempt whose files torch lays out next.
    """

    def __init__(
        self,
        torchrun: TorchrunArgs,
        journal_path: str | None,
        echo: bool,
        next_attempt: Callable[[], int],
    ) -> None:
        self._torchrun = torchrun
        self._echo = echo
        self._next_attempt = next_attempt
        # Wakes the tailer (and the NCCL dump watch) on a write: quiet files cost no polls.
        self.fswatch = FsWatch()
        self.tailer = LogTailer(fswatch=self.fswatch)
        self.duplicates = DuplicateFilter(
            {
                STDOUT: list(torchrun.duplicate_stdout_filters),
                STDERR: list(torchrun.duplicate_stderr_filters),
            }
        )
        if self.duplicates:
            self.tailer.add_sink(self.duplicates, accepts=self.duplicates.accepts)
        self.agent_log = AgentLogCapture()
        self.journal = Journal(journal_path)
        self.run_dir: str | None = None
        self.attempt_dir = ""
        # The current attempt's files, by local rank.
        self.stderr_paths: dict[int, str] = {}
        self.error_files: dict[int, str] = {}
        # Given the run directory and the attempt, variables for that attempt's workers (the
        # Flight Recorder's dump files go in the run directory, named with the attempt).
        self.attempt_env: list[Callable[[str, int], Mapping[str, str]]] = []

    def wrap_logs_specs(self, logs_specs: Any, spec: Any) -> CapturingLogsSpecs:
        """Wrap the user's ``LogsSpecs`` so every rank's output lands in files."""
        return CapturingLogsSpecs(
            logs_specs,
            role=spec.role,
            prefix_template=os.getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
            echo=self._echo,
            on_reify=self.on_reify,
            worker_env=worker_env_defaults(os.environ),
        )

    def on_reify(self, info: ReifiedLogs) -> dict[str, str]:
        """torch laid out the next attempt's files: tail them (on the agent thread); return
        the variables the :attr:`attempt_env` hooks add to its workers' environment."""
        if self.run_dir is None:
            self.set_run_dir(run_dir_of(info.attempt_dir))
        attempt = self._next_attempt()
        for src in info.sources:
            src.attempt = attempt
            if src.stream == STDERR:
                self.stderr_paths[src.local_rank] = src.path
        self.error_files = dict(info.error_files)
        if self.duplicates:
            self.tailer.drain()  # the previous attempt's lines go to the previous files
            self.duplicates.set_files(info.filtered_files)
        self.attempt_dir = info.attempt_dir
        self.tailer.add_sources(info.sources)
        extra: dict[str, str] = {}
        for hook in self.attempt_env:
            extra.update(hook(self.run_dir or info.attempt_dir, attempt))
        return extra

    def ensure_run_dir(self) -> None:
        """Make a run directory if torch did not (the journal and agent log need a home)."""
        if self.run_dir is not None:
            return
        root = self._torchrun.log_dir
        if not root or root == os.devnull:
            root = None
        try:
            if root:
                os.makedirs(root, exist_ok=True)
            run_id = self._torchrun.rdzv_id
            d = tempfile.mkdtemp(prefix=f"{'run' if run_id is None else run_id}_", dir=root)
        except OSError:
            d = tempfile.mkdtemp(prefix="tuilaunch_")
        self.set_run_dir(d)

    def set_run_dir(self, d: str) -> None:
        """The run directory is ``d``: the journal and the agent log go there."""
        self.run_dir = d
        self.journal.set_dir(d)
        self.agent_log.set_dir(d)
