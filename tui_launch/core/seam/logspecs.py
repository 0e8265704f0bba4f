"""The torch half of log capture: a ``LogsSpecs`` subclass that sends every stream to a file.

Part of the torch seam (with :mod:`~tui_launch.core.seam.agent` and
:mod:`~tui_launch.core.seam.rendezvous`): it subclasses torch's ``LogsSpecs`` and reads the private
attributes of the user's one (``DefaultLogsSpecs`` keeps ``--log-dir``, ``--redirects``,
``--tee`` and ``--local-ranks-filter`` only there). What it decides for each attempt goes out
as a :class:`ReifiedLogs` of plain :class:`~tui_launch.core.logs.tail.LogSource` records, which the
torch-free :class:`~tui_launch.core.logs.tail.LogTailer` reads.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std, to_map

from tui_launch.core.logs.tail import STDERR, STDOUT, LogSource
from tui_launch.core.model.layout import RunDirLayout, attempt_dir_of, run_dir_of, stream_log
from tui_launch.core.seam.names import TorchName

_MP_MOD = "torch.distributed.elastic.multiprocessing.api"
# The private attributes of torch's DefaultLogsSpecs that are read below.
PRIVATE_NAMES: tuple[TorchName, ...] = tuple(
    TorchName(_MP_MOD, "DefaultLogsSpecs", name, "instance")
    for name in ("_root_log_dir", "_redirects", "_tee", "_local_ranks_filter")
)


@dataclass
class ReifiedLogs:
    """What :class:`CapturingLogsSpecs` decided for one attempt."""

    attempt: int
    attempt_dir: str
    sources: list[LogSource] = field(default_factory=list)
    error_files: dict[int, str] = field(default_factory=dict)
    filtered_files: dict[str, str] = field(default_factory=dict)


class CapturingLogsSpecs(LogsSpecs):
    """Wrap a ``LogsSpecs`` so that every rank's streams go to files.

    Args:
        inner: the user's ``LogsSpecs`` (torch's default one, or a ``--logs-specs`` plugin).
        role: the worker role, for torchrun's ``[role<local_rank>]:`` console prefix.
        prefix_template: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` if set.
        echo: whether this launcher shows worker output on its console at all (False under
            the dashboard, which shows logs itself).
        on_reify: called with each attempt's :class:`ReifiedLogs` (on the agent thread), once
            torch has laid out its files and before it starts its workers; it returns the
            variables this attempt's workers get besides (unless torch set them), e.g. file
            names in the run directory, which exists only from then on.
        worker_env: variables added to every worker's environment unless torch set them
            (:func:`tui_launch.core.progress.workerenv.worker_env_defaults`).
    """

    def __init__(
        self,
        inner: LogsSpecs,
        role: str,
        prefix_template: str | None,
        echo: bool,
        on_reify: Callable[[ReifiedLogs], Mapping[str, str]],
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            log_dir=getattr(inner, "_root_log_dir", None),
            redirects=getattr(inner, "_redirects", Std.NONE),
            tee=getattr(inner, "_tee", Std.NONE),
            local_ranks_filter=getattr(inner, "_local_ranks_filter", None),
        )
        self._inner = inner
        self._role = role
        self._prefix_template = prefix_template
        self._echo = echo
        self._on_reify = on_reify
        self._worker_env = dict(worker_env or {})
        self._fallback_dir: str | None = None
        self.run_dir: str | None = None

    @property
    def root_log_dir(self) -> str:
        """The user's log directory, as torch reports it."""
        return self._inner.root_log_dir

    def _fallback(self, run_id: str) -> str:
        # Used when the user's specs write no per-rank files (``--log-dir /dev/null``, plugins).
        if self._fallback_dir is None:
            self._fallback_dir = tempfile.mkdtemp(prefix=f"tuilaunch_{run_id}_")
        return self._fallback_dir

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Build the inner destinations, then make sure every stream has a file."""
        # torch starts each worker with os.environ updated by envs[local_rank]: the one place
        # to add a variable for the workers only, not for the launcher itself
        for env in envs.values():
            for key, value in self._worker_env.items():
                env.setdefault(key, value)
        dest = self._inner.reify(envs)
        nprocs = len(envs)
        env0 = envs.get(0, {})
        attempt = int(env0.get("TORCHELASTIC_RESTART_COUNT", "0"))
        run_id = env0.get("TORCHELASTIC_RUN_ID", "run")
        tee = to_map(getattr(self._inner, "_tee", Std.NONE), nprocs)
        ranks_filter = getattr(self._inner, "_local_ranks_filter", None)

        rank_dirs: dict[int, str] = {}
        for lr in range(nprocs):
            err_file = dest.error_files.get(lr, "")
            if err_file and err_file != os.devnull:
                rank_dirs[lr] = os.path.dirname(err_file)
            else:
                rank_dirs[lr] = RunDirLayout(self._fallback(run_id)).rank_dir(attempt, lr)
                os.makedirs(rank_dirs[lr], exist_ok=True)
        attempt_dir = attempt_dir_of(rank_dirs[0]) if nprocs else self._fallback(run_id)
        if self.run_dir is None:
            self.run_dir = run_dir_of(attempt_dir)

        info = ReifiedLogs(
            attempt=attempt,
            attempt_dir=attempt_dir,
            # The filtered_* files exist since torch 2.8 (--duplicate-*-filters).
            filtered_files={
                STDOUT: getattr(dest, "filtered_stdout", ""),
                STDERR: getattr(dest, "filtered_stderr", ""),
            },
        )
        for lr in range(nprocs):
            env = envs[lr]
            global_rank = int(env.get("RANK", lr))
            filtered = ranks_filter is not None and len(ranks_filter) > 0 and lr not in ranks_filter
            for stream, paths, tees, std in (
                (STDOUT, dest.stdouts, dest.tee_stdouts, Std.OUT),
                (STDERR, dest.stderrs, dest.tee_stderrs, Std.ERR),
            ):
                path = paths.get(lr, "")
                # torch tails tee'd files to the console; tuilaunch's tailer does it instead.
                teed = tees.pop(lr, None) is not None
                if path in ("", os.devnull):
                    # torchrun: raw on the console when not redirected, dropped when filtered
                    # out. Either way the file keeps every line.
                    console = path == "" and not filtered
                    path = stream_log(rank_dirs[lr], stream)
                    paths[lr] = path
                else:
                    console = bool(tee[lr] & std) and not filtered
                info.sources.append(
                    LogSource(
                        attempt=attempt,
                        local_rank=lr,
                        global_rank=global_rank,
                        stream=stream,
                        path=path,
                        console=console and self._echo,
                        # torch prefixes only what it tails, never direct console output.
                        prefix=self._prefix(lr, global_rank) if teed else None,
                        teed=teed,
                    )
                )
            info.error_files[lr] = dest.error_files.get(lr, "")
        # torch spawns the workers from these same dicts after reify returns.
        extra = self._on_reify(info)
        for env in envs.values():
            for key, value in extra.items():
                env.setdefault(key, value)
        return dest

    def _prefix(self, local_rank: int, global_rank: int) -> str:
        if self._prefix_template:
            from string import Template

            return Template(self._prefix_template).safe_substitute(
                role_name=self._role, rank=global_rank, local_rank=local_rank
            )
        return f"[{self._role}{local_rank}]:"
