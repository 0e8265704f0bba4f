"""A script whose first import fails: a startup error every attempt."""

import not_a_module_tuilaunch_test  # noqa: F401
