"""Test package, so that ``-m pkg.mod`` works with tests/workers as cwd."""
