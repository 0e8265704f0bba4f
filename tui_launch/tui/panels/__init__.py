"""Pure renderers: snapshot to Rich renderable."""
