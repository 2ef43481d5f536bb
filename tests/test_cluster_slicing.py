"""SINGA's slicing (SPEC §7): the reference values, SINGA's loops, server ranges and loads."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paramserver import ParamError
from paramserver.cluster import compute_slices, partition_slices, plan_servers, server_loads
from paramserver.config.job import ClusterConf
from paramserver.params import ParamSet

DERANDOMIZED = settings(derandomize=True, max_examples=300, deadline=None)

SIZES = [14112, 96, 256, 884736, 384]
PIECES = [97984] + [112448] * 6 + [112064]


@pytest.mark.parametrize(("num", "cut"), [
    (1, [884736]),
    (2, [435328, 449408]),
    (4, [210432, 224896, 224896, 224512]),
    (8, [97984] + [112448] * 6 + [112064]),
])
def test_slice_reference_values(num, cut):
    assert compute_slices(SIZES, num) == [[14112], [96], [256], cut, [384]]


@pytest.mark.parametrize(("num", "servers"), [
    (1, [0] * 8),
    (2, [0, 0, 0, 0, 1, 1, 1, 1]),
    (4, [0, 0, 1, 1, 2, 2, 3, 3]),
    (8, [0, 1, 2, 3, 4, 5, 6, 7]),
])
def test_partition_reference_values(num, servers):
    assert partition_slices(PIECES, num) == servers


def singa_slice(num, sizes):
    """SINGA's Slice, transcribed line by line from src/utils/common.cc."""
    total = sum(sizes)
    avg = total // num + total % num
    diff = avg // 10
    capacity, slices = avg, []
    for x in sizes:
        pieces = []
        while x > 0:
            size = 0
            if capacity >= x:
                capacity -= x
                size, x = x, 0
            elif capacity + diff >= x:
                size, x, capacity = x, 0, 0
            elif capacity >= diff:
                x -= capacity
                size, capacity = capacity, avg
            else:
                capacity = avg
            if size:
                pieces.append(size)
        slices.append(pieces)
    return slices


def singa_partition(num, slices):
    """SINGA's PartitionSlices, transcribed; None where SINGA's loop would never end."""
    total = sum(slices)
    avg = total // num + total % num
    box, boxid, diff, out, i = avg, 0, avg // 10, [], 0
    while i < len(slices):
        x = slices[i]
        if box >= x:
            box -= x
            out.append(boxid)
            i += 1
        elif box + diff >= x:
            out.append(boxid)
            i += 1
            box = 0
        elif box == avg:
            return None  # a fresh box would be opened forever
        else:
            box, boxid = avg, boxid + 1
    return out


sizes_st = st.lists(st.integers(0, 5000), min_size=1, max_size=12)


@DERANDOMIZED
@given(sizes_st, st.integers(1, 9))
def test_slice_is_singas_and_covers_every_param(sizes, num):
    slices = compute_slices(sizes, num)
    assert slices == singa_slice(num, sizes)
    assert [sum(p) for p in slices] == sizes
    assert all(x > 0 for p in slices for x in p)


@DERANDOMIZED
@given(sizes_st, st.integers(1, 9))
def test_partition_is_singas_within_range_and_in_order(sizes, num):
    flat = [x for p in compute_slices(sizes, num) for x in p]
    where = partition_slices(flat, num)
    expected = singa_partition(num, flat)
    if expected is not None:
        assert where == [min(b, num - 1) for b in expected]
    assert all(0 <= b < num for b in where)
    assert where == sorted(where)


def test_partition_never_loops_on_an_oversized_slice():
    assert partition_slices([1, 1000, 1], 3) == [0, 1, 1]  # SINGA: box 1 forever


def test_bad_numbers_are_configuration_errors():
    with pytest.raises(ParamError, match="number of servers must be an integer >= 1"):
        compute_slices([3], 0)
    with pytest.raises(ParamError, match="Param sizes must be >= 0"):
        compute_slices([-1], 2)
    with pytest.raises(ParamError, match="slice sizes must be >= 0"):
        partition_slices([2, -3], 2)


def spec_params():
    return ParamSet([(f"p{i}", (n,)) for i, n in enumerate(SIZES)])


def test_server_ranges_are_contiguous_and_hold_their_slices():
    ps = spec_params()
    layouts = plan_servers(ps, 4)
    assert [(L.start, L.stop) for L in layouts] == [
        (0, 224896), (224896, 449792), (449792, 674688), (674688, 899584)]
    assert [L.slice_ids.tolist() for L in layouts] == [[0, 1, 2, 3], [4], [5], [6, 7]]
    first, last = layouts[0], layouts[3]
    assert first.offsets.tolist() == [0, 14112, 14208, 14464, 224896]
    assert first.names == ("p0", "p1", "p2", "p3")
    assert last.offsets.tolist() == [0, 224512, 224896]
    assert last.owners.tolist() == [3, 4]
    assert last.slice_offsets.tolist() == [0, 224512, 224896]


def test_segments_carry_their_params_scales():
    ps = ParamSet([("w", (10,), {"lr_scale": 2.0, "wd_scale": 0.0}), ("b", (4,))])
    (L,) = plan_servers(ps, 1)
    assert L.lr_scale.tolist() == [2.0, 1.0]
    assert L.wd_scale.tolist() == [0.0, 1.0]


def test_a_server_may_hold_nothing():
    layouts = plan_servers(ParamSet([("w", (10,))]), 4)
    assert [L.size for L in layouts] == [4, 4, 2, 0]
    assert layouts[3].num_slices == 0 and layouts[3].num_segments == 0


def test_server_loads_for_check():
    loads = server_loads(spec_params(), ClusterConf(nservers_per_group=4))
    assert [(x.server, x.slice_ids, x.num_values) for x in loads] == [
        (0, (0, 1, 2, 3), 224896), (1, (4,), 224896), (2, (5,), 224896), (3, (6, 7), 224896)]
    assert server_loads(SIZES, 2) == server_loads(spec_params(), ClusterConf(
        nservers_per_group=2))
    assert sum(x.num_values for x in server_loads(SIZES, 3)) == sum(SIZES)


def test_zero_size_params_have_no_slice():
    ps = ParamSet([("a", (0,)), ("b", (5,)), ("c", (0, 3))])
    assert compute_slices([0, 5, 0], 2) == [[], [3, 2], []]
    layouts = plan_servers(ps, 2)
    assert [L.owners.tolist() for L in layouts] == [[1], [1]]
    assert np.concatenate([L.slice_owners for L in layouts]).tolist() == [1, 1]
