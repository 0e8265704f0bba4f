"""``tuilaunch report``'s renderers: a run's :class:`~tui_launch.core.journal.report.Report` as
one self-contained HTML page or as Markdown.

- ``common``: what both show, as rows of text (the header, the attempts, goodput, failures).
- ``html``: the page: every script and style inline (uPlot, vendored in ``assets/``), a strict
  Content-Security-Policy, no request of any kind.
- ``markdown``: tables and text for a terminal or a pull request (no plots).
"""
