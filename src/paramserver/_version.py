"""paramserver's version: its one home (pyproject.toml reads it; nothing here imports)."""

__version__ = "0.1.0"
