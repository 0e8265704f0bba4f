"""Prometheus metrics of a run (issue 18): ``--metrics-port`` and ``--metrics-textfile``.

- :mod:`~tui_launch.core.metrics.families`: every family, built from one store snapshot, on a
  custom ``prometheus_client`` registry (:class:`RunCollector`), and the hooks for progress and
  hang detection (:data:`ExtraProvider`).
- :mod:`~tui_launch.core.metrics.serve`: :class:`MetricsServer` (``GET /metrics``) and
  :class:`TextfileWriter` (``tuilaunch_<run-id>_<node>.prom`` for node_exporter).
- :mod:`~tui_launch.core.metrics.node`: the ``node`` label (host name, or ``<host>/<group rank>``
  when agents of the run share a host).
- :func:`start_exporters` here is the one call the CLI makes. docs/metrics.md
  lists the metrics, a scrape config and alert rules.

This ``__init__`` loads neither prometheus_client nor the submodules until they are used
(PEP 562), so that a run without the options pays nothing for them, and nothing listens.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tui_launch.core.args import Options
    from tui_launch.core.metrics.families import (
        HANG_SUSPECTED,
        PROGRESS_LAST_STEP,
        PROGRESS_STEP,
        PROGRESS_STEPS_PER_SECOND,
        EventTally,
        ExtraProvider,
        RankProgress,
        RunCollector,
        RunInfo,
        build_families,
        exit_reason,
        hang_families,
        last_output_times,
        progress_families,
        run_info,
    )
    from tui_launch.core.metrics.serve import (
        TEXTFILE_INTERVAL,
        MetricsServer,
        TextfileWriter,
        textfile_name,
        write_atomically,
    )
    from tui_launch.core.store import RunStore


class MetricsError(Exception):
    """An exporter cannot start (the port was taken): one line for the user, exit status 2."""


_LAZY = {
    "families": (
        "HANG_SUSPECTED",
        "PROGRESS_LAST_STEP",
        "PROGRESS_STEP",
        "PROGRESS_STEPS_PER_SECOND",
        "EventTally",
        "ExtraProvider",
        "RankProgress",
        "RunCollector",
        "RunInfo",
        "build_families",
        "exit_reason",
        "hang_families",
        "last_output_times",
        "progress_families",
        "run_info",
    ),
    "serve": (
        "TEXTFILE_INTERVAL",
        "MetricsServer",
        "TextfileWriter",
        "textfile_name",
        "write_atomically",
    ),
}
_WHERE = {name: mod for mod, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


class Exporters:
    """What :func:`start_exporters` started; :meth:`close` ends all of it (idempotent)."""

    def __init__(
        self,
        collector: RunCollector | None = None,
        server: MetricsServer | None = None,
        textfile: TextfileWriter | None = None,
    ) -> None:
        self.collector = collector
        self.server = server
        self.textfile = textfile

    def close(self) -> None:
        """Write the last textfile (``tuilaunch_run_finished 1``), then stop the HTTP server."""
        textfile, self.textfile = self.textfile, None
        server, self.server = self.server, None
        try:
            if textfile is not None:
                textfile.close()
        finally:
            if server is not None:
                server.close()


def start_exporters(
    opts: Options,
    store: RunStore,
    info: RunInfo | None = None,
    *,
    extra: Sequence[ExtraProvider] = (),
) -> Exporters:
    """Start what ``--metrics-port``/``--metrics-textfile`` ask for; nothing when neither.

    How ``cli.py`` calls it: after ``validate()`` (the options were checked, the port tried, by
    ``parse()``), before ``runner.start()``, so that a port taken in between still fails before
    any worker starts; and ``close()`` once the run is over, so the last textfile says so::

        from tui_launch.core import metrics

        try:
            exporters = metrics.start_exporters(opts, store)
        except metrics.MetricsError as e:
            print(f"tuilaunch: error: {e}", file=sys.stderr)
            return USAGE_ERROR
        try:
            ...  # runner.start(), then the dashboard or Headless(store, runner).run()
        finally:
            exporters.close()

    Args:
        opts: tuilaunch's options (``metrics_port``, ``metrics_bind``, ``metrics_textfile``).
        store: the run's store; every scrape and write reads its snapshot.
        info: this node's facts (default :func:`run_info`: the host name, ``--gpu-interval``).
        extra: more families on every scrape (:data:`ExtraProvider`: progress, hangs).

    Raises:
        MetricsError: the port cannot be bound (one line).
    """
    if opts.metrics_port is None and opts.metrics_textfile is None:
        return Exporters()
    from tui_launch.core.events import Notice
    from tui_launch.core.metrics import families, serve

    tally = families.EventTally()
    store.subscribe(tally, replay=True)
    collector = families.RunCollector(
        store.snapshot, info or families.run_info(opts), tally=tally, extra=extra
    )
    server = None
    if opts.metrics_port is not None:
        server = serve.MetricsServer(collector.registry(), opts.metrics_port, opts.metrics_bind)
        server.start()
        # Said once, in the journal and on the console: where to point Prometheus.
        store.post(Notice(level="info", message=f"Prometheus metrics at {server.url}"))
    textfile = None
    if opts.metrics_textfile is not None:
        reported: list[BaseException] = []

        def on_error(e: BaseException) -> None:
            if not reported:  # once: a full disk must not flood the run's events
                reported.append(e)
                store.post(Notice(level="warning", message=f"--metrics-textfile: {e}"))

        def name(final: bool) -> str | None:
            # Fixed at the first write: wait for the run id (the rendezvous makes it) and for
            # the node label to settle (two agents on one host must not share a file).
            run_id = collector.run_id() or ("unknown" if final else None)
            snap = store.snapshot()
            node = collector.node(snap)
            if run_id is None or not (collector.node.settled or final):
                return None
            return serve.textfile_name(run_id, node)

        def finish() -> None:
            collector.final = True

        textfile = serve.TextfileWriter(
            collector.registry(), opts.metrics_textfile, name, finish=finish, on_error=on_error
        ).start()
    return Exporters(collector, server, textfile)


__all__ = [
    "HANG_SUSPECTED",
    "PROGRESS_LAST_STEP",
    "PROGRESS_STEP",
    "PROGRESS_STEPS_PER_SECOND",
    "TEXTFILE_INTERVAL",
    "EventTally",
    "Exporters",
    "ExtraProvider",
    "MetricsError",
    "MetricsServer",
    "RankProgress",
    "RunCollector",
    "RunInfo",
    "TextfileWriter",
    "build_families",
    "exit_reason",
    "hang_families",
    "last_output_times",
    "progress_families",
    "run_info",
    "start_exporters",
    "textfile_name",
    "write_atomically",
]
