"""Pure renderers: snapshot (and the current time) in, rich renderable out.

- ``render``: the header and the rendezvous, restarts, root-cause and cluster panels.
- ``ranks``: the per-rank side: the GPU panel and the workers table's cells.
- ``progress``: progress cells, the header's job progress, goodput.
- ``stacks``: the Stacks tab: the latest dump grouped, the odd ranks highlighted.
- ``inert``: worker and journal text made inert for the terminal (no escape sequences).
"""
