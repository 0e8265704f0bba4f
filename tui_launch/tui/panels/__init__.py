"""Pure renderers: snapshot (and the current time) in, rich renderable out; and the panels
that show them, declared beside them and listed once in ``board``.

- ``render``: the header and the rendezvous, restarts, root-cause and cluster panels.
- ``ranks``: the per-rank side: the GPU panel and the workers table's cells.
- ``progress``: progress cells, the header's job progress, goodput.
- ``stacks``: the Stacks tab: the latest dump grouped, the odd ranks highlighted.
- ``inert``: worker and journal text made inert for the terminal (no escape sequences).
- ``base``: a panel as a record: where it sits, its key (what it shows), its renderer.
- ``board``: ``PANELS``, every panel of the dashboard in the order it sits.
"""
