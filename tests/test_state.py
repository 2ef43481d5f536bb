"""The one updater-state object (paramserver.state): its layout, its views, its checked
export and import, and roles of other types and lengths (per segment, per block)."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.state import COUNT, Role, UpdaterState

OFFSETS = [0, 5, 5, 12, 20]  # four segments, one of them empty
SCALE = Role("scale", "float32", "block", 4)
CODES = Role("codes", "int8")


def make() -> UpdaterState:
    s = UpdaterState(["h", CODES, SCALE], OFFSETS, np.float64)
    for arr in s.arrays.values():
        arr[...] = np.arange(arr.size)
    return s


def test_layout_per_element_segment_and_block() -> None:
    s = make()
    assert s.names == (COUNT, "h", "codes", "scale")
    assert s.size == 20 and s.num_segments == 4
    assert s["h"].dtype == np.float64 and s["h"].shape == (20,)
    assert s["codes"].dtype == np.int8 and s["codes"].shape == (20,)
    assert s.counts.dtype == np.int64 and s.counts.shape == (4,)
    # blocks of 4 counted from each segment's start: 5 -> 2, 0 -> 0, 7 -> 2, 8 -> 2
    assert s.block_offsets(4).tolist() == [0, 2, 2, 4, 6] and s["scale"].shape == (6,)


def test_views_share_memory() -> None:
    s = make()
    seg = s.segments(2, 4)
    assert seg.offsets.tolist() == [0, 7, 15]
    assert seg["h"].tolist() == list(range(5, 20)) and seg.counts.tolist() == [2, 3]
    assert seg["scale"].tolist() == [2, 3, 4, 5]
    seg["h"][0] = -1.0
    assert s["h"][5] == -1.0
    one = s.segment(3)
    assert one["h"].tolist() == list(range(12, 20)) and one[COUNT].tolist() == [3]
    assert one["scale"].tolist() == [4, 5]


def test_element_views_cut_segments_on_block_boundaries() -> None:
    s = make()
    v = s.elements(9, 16)  # segment 2's second block, segment 3's first
    assert v.offsets.tolist() == [0, 3, 7]
    assert v["h"].tolist() == list(range(9, 16))
    assert v.counts.tolist() == [2, 3]
    assert v["scale"].tolist() == [3, 4]
    assert s.elements(3, 3).size == 0
    with pytest.raises(ParamError, match="cuts a block of role 'scale'"):
        s.elements(6, 16)  # 1 value into segment 2: not a block boundary
    plain = UpdaterState(["h"], OFFSETS, np.float32)
    assert plain.elements(6, 9)["h"].shape == (3,)  # no blocks: any range


def test_export_and_checked_import_round_trip() -> None:
    s = make()
    names = ["a", "empty", "b", "c"]
    saved = s.export(names)
    assert sorted(saved) == sorted(f"{n}/{r}" for n in names for r in s.names)
    assert saved["b/scale"].tolist() == [2, 3] and saved["c/count"].tolist() == [3]
    other = UpdaterState(["h", CODES, SCALE], OFFSETS, np.float64)
    other.load(saved, names)
    assert all(np.array_equal(other[k], s[k]) for k in s.names)
    bad = dict(saved)
    bad["b/codes"] = bad["b/codes"].astype(np.int16)
    bad["c/count"] = np.array([-1])
    del bad["a/h"]
    bad["a/extra"] = np.zeros(5)
    before = {k: v.copy() for k, v in other.arrays.items()}
    with pytest.raises(ParamError) as e:
        other.load(bad, names)
    assert [p.message for p in e.value.problems] == [
        "'a/extra' is not state of this updater (its keys are '<param>/<role>', roles "
        "['count', 'h', 'codes', 'scale'])",
        "'a/h' is missing",
        "'b/codes' is int16 of 7 entries, expected int8 of 7",
        "'c/count' is -1: an update count is >= 0"]
    assert all(np.array_equal(other[k], v) for k, v in before.items())  # nothing changed


def test_roles_are_checked_and_added() -> None:
    with pytest.raises(ParamError, match=r"block .* must be > 0 exactly when per is 'block'"):
        Role("s", per="block")
    with pytest.raises(ParamError, match="declared twice"):
        UpdaterState(["h", "h"], [0, 3], np.float32)
    with pytest.raises(ParamError, match="per-segment update count"):
        UpdaterState([Role(COUNT)], [0, 3], np.float32)
    s = UpdaterState(["h"], [0, 3], np.float32)
    s["h"][...] = 1.0
    t = s.with_roles(["h", "u"])
    assert t.names == (COUNT, "h", "u") and t["h"] is s["h"] and t["u"].sum() == 0
    assert s.with_roles(["h"]) is s
