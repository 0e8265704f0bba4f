"""The run directory's layout: the one place that names a run's files.

torch lays out a run's directory in ``--log-dir`` (``DefaultLogsSpecs``: one sub-directory
per run, ``attempt_<restart count>/<local rank>/`` below it); tuilaunch adds its own files
beside torch's. Everything that writes or reads one of them takes its path from here, so the
layout is said once (``tests/test_layout.py`` refuses a layout string anywhere else in the
package)::

    <run dir>/
        journal.jsonl                 every journaled event (core/journal/writer.py)
        agent.log                     the agent's own log lines (core/logs/sinks.py)
        console.log                   a detached run's console (core/remote/detach.py)
        control.sock                  the control socket (core/remote/controlsock.py)
        attempt_<N>/<local rank>/
            stdout.log, stderr.log    the rank's streams (torch, or core/seam/logspecs.py)
            error.json                torch's @record error file
        stacks/<time>-<reason>/       a stack dump (core/diagnosis/stacks/save.py)
            stacks.json, stacks.txt   the dump and its verdict, for machines and for people
            flightrec/rank<N>.json    each rank's Flight Recorder, as torch dumped it
            flightrec/<host>.attempt<A>.rank_<N>   the same, as torch's analyser reads it
                                      (``torchfrtrace <dump dir>/flightrec``: pickle)
            job.json, job.txt         a job-wide dump's answers (core/job/jobstacks.py)
        flightrec/<host>.attempt<A>.rank_<N>   NCCL's own Flight Recorder dumps (pickle),
                                      written here by torch (a watchdog timeout, the pipe)

Pure: paths are built, never looked at, except by :meth:`RunDirLayout.local_ranks`, which
lists an attempt's directory. A layout over ``""`` gives paths relative to the run directory
(what a report shows). The names are part of the on-disk format: old run directories must
still read, so none of them may change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# The two streams of a rank, as the log sources, the journal's log marks and the file names
# say them.
STDOUT, STDERR = "stdout", "stderr"
STREAMS = (STDOUT, STDERR)

JOURNAL_NAME = "journal.jsonl"
AGENT_LOG_NAME = "agent.log"
CONSOLE_NAME = "console.log"
CONTROL_SOCKET_NAME = "control.sock"
STACKS_NAME = "stacks"
FLIGHTREC_NAME = "flightrec"
ERROR_FILE_NAME = "error.json"  # torch's (``TORCHELASTIC_ERROR_FILE``)
ATTEMPT_PREFIX = "attempt_"
LOG_SUFFIX = ".log"
# A dump directory's files.
STACKS_JSON = "stacks.json"
STACKS_TEXT = "stacks.txt"
JOB_JSON = "job.json"
JOB_TEXT = "job.txt"


def attempt_name(attempt: int) -> str:
    """The name of attempt ``attempt``'s directory (``attempt_<N>``; torch's restart count)."""
    return f"{ATTEMPT_PREFIX}{attempt}"


def log_name(stream: str) -> str:
    """The file name of a rank's ``stream`` (``stdout.log``, ``stderr.log``)."""
    return f"{stream}{LOG_SUFFIX}"


def rank_dir_in(attempt_dir: str, local_rank: int) -> str:
    """Local rank ``local_rank``'s directory in an attempt's directory."""
    return os.path.join(attempt_dir, str(local_rank))


def stream_log(rank_dir: str, stream: str) -> str:
    """A rank's ``stream`` log in its directory."""
    return os.path.join(rank_dir, log_name(stream))


def rank_log_in(attempt_dir: str, local_rank: int, stream: str) -> str:
    """Local rank ``local_rank``'s ``stream`` log in an attempt's directory (the journal's
    ``WorkersStarted.log_dir`` names the attempt's directory)."""
    return stream_log(rank_dir_in(attempt_dir, local_rank), stream)


def attempt_dir_of(rank_dir: str) -> str:
    """The attempt directory a rank's directory is in."""
    return os.path.dirname(rank_dir)


def run_dir_of(path: str) -> str:
    """The run directory an attempt's directory, or the journal, is in."""
    return os.path.dirname(path)


def journal_of(target: str) -> str:
    """The journal a run directory or a journal file names (the path, checked by nobody)."""
    return os.path.join(target, JOURNAL_NAME) if os.path.isdir(target) else target


def dump_files(dump_dir: str) -> tuple[str, str]:
    """A stack dump's ``stacks.json`` and ``stacks.txt``."""
    return os.path.join(dump_dir, STACKS_JSON), os.path.join(dump_dir, STACKS_TEXT)


def dump_records_dir(dump_dir: str) -> str:
    """Where a stack dump keeps each rank's raw Flight Recorder answer."""
    return os.path.join(dump_dir, FLIGHTREC_NAME)


def dump_record(dump_dir: str, global_rank: int) -> str:
    """Global rank ``global_rank``'s raw Flight Recorder answer in a stack dump."""
    return os.path.join(dump_records_dir(dump_dir), f"rank{global_rank}.json")


# torch's analyser (``torchfrtrace``) takes the rank from the digits after a prefix common
# to every file of the directory; the host and attempt come before a dot, which its guess of
# the prefix never crosses, so the prefix it finds is this one.
ANALYSER_PREFIX = "rank_"


def analyser_stem(host: str, attempt: int) -> str:
    """The start of a Flight Recorder file's name that torch's analyser reads: the rank
    follows (``<host>.attempt<A>.rank_``; torch's NCCL dumps take it as their prefix)."""
    return f"{host}.attempt{attempt}.{ANALYSER_PREFIX}"


def dump_analyser_record(dump_dir: str, host: str, attempt: int, global_rank: int) -> str:
    """Global rank ``global_rank``'s Flight Recorder in a stack dump, in torch's own format."""
    return os.path.join(dump_records_dir(dump_dir), f"{analyser_stem(host, attempt)}{global_rank}")


def job_files(dump_dir: str) -> tuple[str, str]:
    """A job-wide dump's ``job.json`` and ``job.txt`` (in the asking node's dump)."""
    return os.path.join(dump_dir, JOB_JSON), os.path.join(dump_dir, JOB_TEXT)


@dataclass(frozen=True)
class RunDirLayout:
    """The paths of one run directory's files.

    Args:
        root: the run directory (``""``: paths relative to it).
    """

    root: str

    @property
    def journal(self) -> str:
        """The event journal (unless ``--journal`` put it elsewhere)."""
        return os.path.join(self.root, JOURNAL_NAME)

    @property
    def agent_log(self) -> str:
        """The agent's own log lines."""
        return os.path.join(self.root, AGENT_LOG_NAME)

    @property
    def console_log(self) -> str:
        """A detached run's console output."""
        return os.path.join(self.root, CONSOLE_NAME)

    @property
    def control_socket(self) -> str:
        """The control socket (when its path fits in a Unix socket address)."""
        return os.path.join(self.root, CONTROL_SOCKET_NAME)

    @property
    def stacks_dir(self) -> str:
        """The directory of every stack dump."""
        return os.path.join(self.root, STACKS_NAME)

    @property
    def flightrec_dir(self) -> str:
        """NCCL's own Flight Recorder dumps, written here by torch."""
        return os.path.join(self.root, FLIGHTREC_NAME)

    def dump_dir(self, name: str) -> str:
        """The stack dump called ``name`` (``<time>-<reason>``)."""
        return os.path.join(self.stacks_dir, name)

    def attempt_dir(self, attempt: int) -> str:
        """Attempt ``attempt``'s directory."""
        return os.path.join(self.root, attempt_name(attempt))

    def rank_dir(self, attempt: int, local_rank: int) -> str:
        """Local rank ``local_rank``'s directory in attempt ``attempt``."""
        return rank_dir_in(self.attempt_dir(attempt), local_rank)

    def rank_log(self, attempt: int, local_rank: int, stream: str) -> str:
        """Local rank ``local_rank``'s ``stream`` log in attempt ``attempt``."""
        return rank_log_in(self.attempt_dir(attempt), local_rank, stream)

    def error_file(self, attempt: int, local_rank: int) -> str:
        """torch's error file of local rank ``local_rank`` in attempt ``attempt``."""
        return os.path.join(self.rank_dir(attempt, local_rank), ERROR_FILE_NAME)

    def local_ranks(self, attempt: int) -> list[int]:
        """The local ranks with a directory in attempt ``attempt``, in order (reads the
        directory; OSError when it cannot)."""
        return sorted(int(d) for d in os.listdir(self.attempt_dir(attempt)) if d.isdigit())


__all__ = [
    "AGENT_LOG_NAME",
    "ATTEMPT_PREFIX",
    "CONSOLE_NAME",
    "CONTROL_SOCKET_NAME",
    "ERROR_FILE_NAME",
    "FLIGHTREC_NAME",
    "JOB_JSON",
    "JOB_TEXT",
    "JOURNAL_NAME",
    "LOG_SUFFIX",
    "STACKS_JSON",
    "STACKS_NAME",
    "STACKS_TEXT",
    "STDERR",
    "STDOUT",
    "STREAMS",
    "RunDirLayout",
    "attempt_dir_of",
    "attempt_name",
    "dump_files",
    "dump_record",
    "dump_records_dir",
    "job_files",
    "journal_of",
    "log_name",
    "rank_dir_in",
    "rank_log_in",
    "run_dir_of",
    "stream_log",
]
