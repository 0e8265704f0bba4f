"""The launcher's core: runner, events, store, journal, logs, errors.

Nothing in this package imports Textual or rich (a test checks it in a subprocess), so the
headless mode, the journal and other tools can use it without a UI stack.
"""
