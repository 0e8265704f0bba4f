"""``python -m tui_launch``: the same as the ``tuilaunch`` command."""

from tui_launch.cli import main

if __name__ == "__main__":
    main()
