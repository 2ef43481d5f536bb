"""What a resumed run's metrics.csv holds against a straight run's (issue 38)."""

from __future__ import annotations

from pathlib import Path


def assert_rows_of_a_resume(straight: Path, resumed: Path, end: int) -> None:
    """The resumed run's metrics.csv (in the folder ``resumed``) is the straight run's, but
    for the rows the earlier run made when it ended at step ``end`` (its last train window,
    its final test), which a straight run does not make: they happened, and are kept, as
    TensorBoard keeps them."""
    a = (straight / "metrics.csv").read_text().splitlines()
    b = (resumed / "metrics.csv").read_text().splitlines()
    extra = [r for r in b if r not in a]
    assert all(r.startswith(f"{end},") for r in extra), extra
    assert [r for r in b if r not in extra] == a
