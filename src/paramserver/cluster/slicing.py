"""SINGA's slicing (SPEC §7): cut Params into slices of equal load, give slices to servers.

Both algorithms are SINGA's ``Slice`` and ``PartitionSlices`` (``src/utils/common.cc``), in
the same integer arithmetic, so that a SINGA job is sliced as SINGA slices it:

- ``avg = total // num + total % num`` is the capacity of a box (a server's share) and
  ``diff = avg // 10`` the slack;
- boxes are filled in order: an item that fits whole, or overflows the box by at most
  ``diff``, goes in whole; otherwise (slicing) it is cut at the box boundary when at least
  ``diff`` is left in the box, or a new box is opened.

Slices of all Params get consecutive ids from 0, in Param order, and partitioning fills
boxes in order, so the slices of one server are always one contiguous range of the Params'
flat memory (see :mod:`paramserver.cluster.layout`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import ParamError


def _capacity(total: int, num: int) -> tuple[int, int]:
    avg = total // num + total % num
    return avg, avg // 10


def _check(sizes: Sequence[int], num: int, what: str) -> list[int]:
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ParamError(f"the number of servers must be an integer >= 1, not {num!r}")
    out = [int(x) for x in sizes]
    bad = [x for x in out if x < 0]
    if bad:
        raise ParamError(f"{what} must be >= 0, got {bad[0]}")
    return out


def compute_slices(sizes: Sequence[int], num: int) -> list[list[int]]:
    """SINGA's ``Slice(num, sizes)``: the slice sizes of each Param, for ``num`` servers.

    Args:
        sizes: number of values of each (owner) Param, in Param order.
        num: number of servers (boxes) to balance the load over.

    Returns:
        For each Param the sizes of its slices, in order; they sum to the Param's size.
        A Param of size 0 has no slice.

    Example (SPEC §7)::

        >>> compute_slices([14112, 96, 256, 884736, 384], 2)
        [[14112], [96], [256], [435328, 449408], [384]]
    """
    sizes = _check(sizes, num, "Param sizes")
    avg, diff = _capacity(sum(sizes), num)
    capacity = avg
    slices: list[list[int]] = []
    for x in sizes:
        pieces: list[int] = []
        while x > 0:
            if capacity >= x:  # fits whole
                pieces.append(x)
                capacity -= x
                x = 0
            elif capacity + diff >= x:  # overflows by at most diff: still whole
                pieces.append(x)
                capacity = 0
                x = 0
            elif capacity >= diff:  # cut at the box boundary
                if capacity > 0:
                    pieces.append(capacity)
                x -= capacity
                capacity = avg
            else:  # too little left: next box
                capacity = avg
        slices.append(pieces)
    return slices


def partition_slices(slices: Sequence[int], num: int) -> list[int]:
    """SINGA's ``PartitionSlices(num, slices)``: the server of each slice.

    Args:
        slices: sizes of all slices, in slice id order (e.g. the flattened output of
            :func:`compute_slices`).
        num: number of servers.

    Returns:
        For each slice its server, ``0 <= server < num``; non-decreasing.

    SINGA's loop never ends for a slice larger than a whole box plus its slack, and can
    number a box ``num`` or more when slack accumulates; here such a slice goes into the
    box it starts (a fresh box is never skipped) and boxes beyond the last are the last.

    Example (SPEC §7)::

        >>> partition_slices([97984] + [112448] * 6 + [112064], 4)
        [0, 0, 1, 1, 2, 2, 3, 3]
    """
    sizes = _check(slices, num, "slice sizes")
    avg, diff = _capacity(sum(sizes), num)
    box, boxid = avg, 0
    owner: list[int] = []
    for x in sizes:
        if box < avg and box + diff < x:  # does not fit: next box (a fresh one takes it)
            box, boxid = avg, boxid + 1
        owner.append(min(boxid, num - 1))
        box = box - x if box >= x else 0
    return owner


__all__ = ["compute_slices", "partition_slices"]
