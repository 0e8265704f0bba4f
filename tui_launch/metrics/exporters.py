"""Start and stop what ``--metrics-port`` and ``--metrics-textfile`` ask for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tui_launch.core.launch.args import Options
    from tui_launch.core.model.store import RunStore
    from tui_launch.metrics.families import (
        ExtraProvider,
        RunCollector,
        RunInfo,
    )
    from tui_launch.metrics.serve import (
        MetricsServer,
        TextfileWriter,
    )


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

        from tui_launch import metrics

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
    from tui_launch.core.model.events import Notice
    from tui_launch.metrics import families, serve

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
