"""The random layer under initialisation: values, reproducibility, statistics, messages."""

from __future__ import annotations

import hashlib
import itertools

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from paramserver.numerics import rng_kernels
from paramserver.numerics.rng import (
    fill_normal,
    fill_truncated_normal,
    fill_uniform,
    param_key,
    standard_normal_matrix,
)

KEY = param_key(20240601, "fc1_weight")
FILLS = [fill_uniform, fill_normal, fill_truncated_normal]
DTYPES = [np.float32, np.float64]


def filled(fill, n, dtype=np.float32, key=KEY, offset=0, **kw):
    out = np.empty(n, dtype)
    fill(out, key, **kw, offset=offset)
    return out


# --- Philox and the documented layout ---------------------------------------------------------


@pytest.mark.parametrize(
    ("ctr", "key", "expected"),
    [  # Random123's known-answer vectors for philox4x32-10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ],
)
def test_philox_known_answers(ctr, key, expected):
    words = rng_kernels._philox_block(*(np.uint64(v) for v in (*ctr, *key)))
    assert tuple(int(w) for w in words) == expected


def block(key, j):
    """The bulk Philox block j of stream ``key``, as four ints."""
    k = (np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32))
    return [int(w) for w in rng_kernels._philox_block(np.uint64(j & 0xFFFFFFFF), np.uint64(j >> 32),
                                              np.uint64(0), np.uint64(0), *k)]


@pytest.mark.parametrize("i", [0, 1, 2, 3, 4, 65535, 65536, 99_998])
def test_uniform_follows_the_documented_layout(i):
    """float32 element i: word i % 4 of block i // 4, top 24 bits; float64: two words, 53."""
    low, high = -0.5, 3.0
    u24 = (block(KEY, i // 4)[i % 4] >> 8) / 2.0**24
    lo32, hi32 = float(np.float32(low)), float(np.float32(high))
    expected32 = np.float32(lo32 + (hi32 - lo32) * u24)  # computed in float64, then rounded
    assert filled(fill_uniform, 100_000, np.float32, low=low, high=high)[i] == expected32
    words = block(KEY, i // 2)
    bits = words[2 * (i % 2)] | words[2 * (i % 2) + 1] << 32
    expected64 = low + (high - low) * ((bits >> 11) / 2.0**53)
    assert filled(fill_uniform, 100_000, np.float64, low=low, high=high)[i] == expected64


# --- param_key ----------------------------------------------------------------------------------


def test_param_key_is_the_documented_blake2b():
    digest = hashlib.blake2b(b"conv1_0", digest_size=8, key=(7).to_bytes(8, "little")).digest()
    assert param_key(7, "conv1_0") == int.from_bytes(digest, "little")
    assert 0 <= param_key(2**64 - 1, "x") < 2**64
    assert param_key(np.uint64(7), "conv1_0") == param_key(7, "conv1_0")


def test_param_key_separates_names_and_seeds():
    keys = {param_key(seed, name) for seed in (0, 1, 2) for name in ("w", "b", "fc1_0", "fc1_1")}
    assert len(keys) == 12


@pytest.mark.parametrize(
    ("seed", "name", "message"),
    [(-1, "w", r"seed must be an int in \[0, 2\*\*64\), got -1"),
     (2**64, "w", "seed must be an int"),
     (1.5, "w", "seed must be an int in .* got float"),
     (True, "w", "got bool"),
     (1, 3, "name must be a str, got int")],
)
def test_param_key_errors(seed, name, message):
    with pytest.raises(ValueError, match=message):
        param_key(seed, name)


# --- reproducibility ----------------------------------------------------------------------------


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_same_key_same_values_and_prefix_property(fill, dtype):
    n = 3 * (1 << 16) + 5  # several parallel chunks and an unaligned end
    a = filled(fill, n, dtype)
    assert np.array_equal(a, filled(fill, n, dtype))
    for m in (1, 2, 3, 7, 1 << 16, n - 1):
        assert np.array_equal(filled(fill, m, dtype), a[:m])


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pieces_with_offsets_equal_one_fill(fill, dtype):
    """A server filling its slices gets what one whole fill gives (any split, any alignment)."""
    n = 150_001
    whole = filled(fill, n, dtype)
    cuts = [0, 1, 3, 6, 1000, 65_535, 65_537, 100_002, 131_072, n]
    pieces = [filled(fill, b - a, dtype, offset=a) for a, b in itertools.pairwise(cuts)]
    assert np.array_equal(np.concatenate(pieces), whole)


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(0, 300_000), n=st.integers(0, 70_000),
       method=st.sampled_from(FILLS), dtype=st.sampled_from(DTYPES))
def test_offset_property(offset, n, method, dtype):
    whole = filled(method, offset + n, dtype)
    assert np.array_equal(filled(method, n, dtype, offset=offset), whole[offset:])


@pytest.mark.skipif(getattr(numba.config, "NUMBA_NUM_THREADS", 1) < 2,
                    reason="needs two numba threads")
@pytest.mark.parametrize("fill", FILLS)
def test_thread_count_does_not_change_values(fill):
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = filled(fill, 500_003)
        numba.set_num_threads(2)
        two = filled(fill, 500_003)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one, two)


@pytest.mark.parametrize("fill", FILLS)
def test_nd_arrays_fill_in_c_order(fill):
    grid = np.empty((30, 7, 11), np.float32)
    fill(grid, KEY)
    assert np.array_equal(grid.ravel(), filled(fill, grid.size))


@pytest.mark.parametrize("fill", FILLS)
def test_names_give_independent_streams(fill):
    a = filled(fill, 200_000, key=param_key(1, "fc1_0"))
    b = filled(fill, 200_000, key=param_key(1, "fc1_1"))
    c = filled(fill, 200_000, key=param_key(1, "fc1_0") + 1)  # a neighbouring key
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.01
    assert abs(np.corrcoef(a, c)[0, 1]) < 0.01
    assert np.mean(a == b) < 0.001


def test_truncated_normal_keeps_the_normal_draws_inside_the_bounds():
    for dtype in DTYPES:
        z = filled(fill_normal, 100_000, dtype)
        t = filled(fill_truncated_normal, 100_000, dtype)
        inside = np.abs(z) <= 2
        assert np.array_equal(t[inside], z[inside])


def test_empty_and_degenerate_fills():
    fill_normal(np.empty(0, np.float32), KEY)
    assert np.all(filled(fill_normal, 1000, mean=3.0, std=0.0) == 3.0)
    assert np.all(filled(fill_uniform, 1000, low=2.5, high=2.5) == 2.5)
    assert np.all(filled(fill_truncated_normal, 1000, np.float64, mean=-1.0, std=0.0) == -1.0)


def test_standard_normal_matrix():
    m = standard_normal_matrix((40, 25), KEY)
    assert m.shape == (40, 25) and m.dtype == np.float64 and m.flags.c_contiguous
    assert np.array_equal(m.ravel(), filled(fill_normal, 1000, np.float64))


# --- statistics ---------------------------------------------------------------------------------

N = 1 << 20


@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_statistics(dtype):
    low, high = -3.0, 5.0
    x = filled(fill_uniform, N, dtype, low=low, high=high).astype(np.float64)
    assert x.min() >= low and x.max() < high
    assert abs(x.mean() - 1.0) < 5 * 8 / np.sqrt(12 * N)
    assert abs(x.var() - 64 / 12) < 0.02
    assert stats.kstest(x, stats.uniform(low, high - low).cdf).pvalue > 1e-4


def test_uniform_never_reaches_high_in_float32():
    x = filled(fill_uniform, 100_000, np.float32, low=1.0, high=1.0000003)
    assert x.min() >= np.float32(1.0) and x.max() < np.float32(1.0000003)
    assert len(np.unique(x)) > 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_statistics(dtype):
    x = filled(fill_normal, N, dtype, mean=0.5, std=2.0).astype(np.float64)
    assert abs(x.mean() - 0.5) < 5 * 2 / np.sqrt(N)
    assert abs(x.std() - 2.0) < 0.01
    assert abs(stats.skew(x)) < 0.01 and abs(stats.kurtosis(x)) < 0.02
    assert stats.kstest(x, stats.norm(0.5, 2.0).cdf).pvalue > 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_tails_and_slow_path(dtype):
    """The ziggurat's tail (beyond 3.654) and rare paths have the right mass."""
    z = filled(fill_normal, 1 << 21, dtype).astype(np.float64)
    for cut in (2.0, 3.0, 3.6541528853610088, 4.0):
        expected = 2 * stats.norm.sf(cut) * z.size
        assert abs(np.sum(np.abs(z) > cut) - expected) < 5 * np.sqrt(expected) + 1
    counts, edges = np.histogram(z, bins=np.linspace(-4, 4, 161))
    expected = np.diff(stats.norm.cdf(edges)) * z.size
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert stats.chi2.sf(chi2, len(counts) - 1) > 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("a", "b"),
    [(-2.0, 2.0),  # rejection from the element's normal
     (0.0, np.inf),  # half-normal: rejection
     (-np.inf, -1.0),  # one-sided, 16 % of the mass: inverse CDF
     (1.0, 1.5),  # narrow, above 0: inverse CDF on the mirrored interval
     (-0.1, 0.2),  # narrow, around 0
     (5.0, 8.0)],  # far tail
)
def test_truncated_normal_statistics(dtype, a, b):
    mean, std = 1.0, 0.5
    x = filled(fill_truncated_normal, 1 << 17, dtype, mean=mean, std=std, a=a, b=b)
    assert x.min() >= dtype(mean + a * std) and x.max() <= dtype(mean + b * std)
    target = stats.truncnorm(a, b, loc=mean, scale=std)
    assert stats.kstest(x.astype(np.float64), target.cdf).pvalue > 1e-4
    assert abs(x.mean() - target.mean()) < 6 * target.std() / np.sqrt(x.size) + 1e-6


def test_ndtri_matches_scipy():
    p = np.concatenate([10.0 ** -np.arange(1, 300, 7.5), np.linspace(0.001, 0.999, 999),
                        1 - 10.0 ** -np.arange(4, 16, 0.5)])
    ours = np.array([rng_kernels._ndtri(v) for v in p])
    np.testing.assert_allclose(ours, special.ndtri(p), rtol=1e-12, atol=1e-12)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "message"),
    [([0.0, 1.0], "out must be a numpy.ndarray, got list"),
     (np.zeros(4, np.int64), "out must have dtype float32 or float64, got int64"),
     (np.zeros(4, np.float16), "got float16"),
     (np.zeros(8, np.float32)[::2], "out must be C-contiguous"),
     (np.zeros((3, 4), np.float32, order="F"), "out must be C-contiguous")],
)
@pytest.mark.parametrize("fill", FILLS)
def test_bad_arrays(fill, out, message):
    with pytest.raises(ValueError, match=message):
        fill(out, KEY)


def test_read_only_array():
    out = np.zeros(4, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        fill_normal(out, KEY)


@pytest.mark.parametrize(
    ("key", "offset", "message"),
    [(-1, 0, r"key must be an int in \[0, 2\*\*64\), got -1"),
     (2**64, 0, "key must be an int"),
     (1.0, 0, "key must be an int in .* got float"),
     (1, -1, r"offset must be in \[0, 2\*\*62 - out.size\], got -1"),
     (1, 2**62, "offset must be in"),
     (1, 2.0, "offset must be an int, got float")],
)
def test_bad_key_or_offset(key, offset, message):
    with pytest.raises(ValueError, match=message):
        fill_uniform(np.zeros(4), key, offset=offset)


@pytest.mark.parametrize(
    ("fill", "kwargs", "message"),
    [(fill_uniform, {"low": 1.0, "high": 0.0}, "low must be <= high, got low=1.0, high=0.0"),
     (fill_uniform, {"high": np.inf}, "high must be finite in float32, got inf"),
     (fill_uniform, {"high": 1e39}, "high must be finite in float32, got 1e[+]?39"),
     (fill_uniform, {"low": "0"}, "low must be a real number, got str"),
     (fill_normal, {"std": -1.0}, "std must be >= 0, got -1.0"),
     (fill_normal, {"mean": np.nan}, "mean must be finite"),
     (fill_truncated_normal, {"a": 2.0, "b": 2.0}, "a must be < b .* got a=2.0, b=2.0"),
     (fill_truncated_normal, {"a": np.nan}, "a must be a real number"),
     (fill_truncated_normal, {"a": 40.0, "b": 50.0}, "lies too far in a tail"),
     (fill_truncated_normal, {"std": -0.5}, "std must be >= 0")],
)
def test_bad_distribution_arguments(fill, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fill(np.zeros(4, np.float32), KEY, **kwargs)


def test_uniform_span_must_be_finite():
    with pytest.raises(ValueError, match="high - low must be finite in float64"):
        fill_uniform(np.zeros(4), KEY, -1e308, 1e308)
    wide = filled(fill_uniform, 10_000, np.float32, low=-3e38, high=3e38)
    assert np.all(np.isfinite(wide)) and wide.min() < -1e38 and wide.max() > 1e38


def test_a_float32_job_compiles_only_the_float32_fillers() -> None:
    """Fills of at most one chunk (every Param of the main job) run their chunk filler
    directly and make no parallel filler; a longer float32 fill makes only the float32 one
    without the truncated path (a fresh process, so that no other test has used them)."""
    import subprocess
    import sys

    code = ("import numpy as np\nfrom paramserver.numerics import rng, rng_kernels\n"
            "a = np.empty(rng_kernels._CHUNK, np.float32)\n"
            "rng.fill_uniform(a, 1)\nrng.fill_normal(a, 2)\n"
            "print(sorted(rng_kernels._fills))\n"
            "a = np.empty(rng_kernels._CHUNK + 1, np.float32)\n"
            "rng.fill_uniform(a, 1)\nrng.fill_normal(a, 2)\n"
            "print(sorted(rng_kernels._fills))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["[]", "[(True, False)]"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("fill", "kw"), [(fill_uniform, {}), (fill_normal, {}),
                                         (fill_truncated_normal, {}),
                                         (fill_truncated_normal, {"a": 2.5, "b": 3.0})])
def test_one_chunk_fills_equal_the_parallel_fill(fill, kw, dtype) -> None:
    """A fill of at most ``_CHUNK`` elements runs the chunk filler in the caller's thread;
    a longer one the parallel filler: the same values wherever they meet, at offsets that
    cross chunk boundaries and Philox blocks."""
    n = rng_kernels._CHUNK
    whole = filled(fill, 3 * n + 7, dtype, **kw)
    for offset in (0, 1, 3, n - 5, n + 2, 2 * n - 1):
        for size in (1, 5, n - 3, n):
            assert np.array_equal(filled(fill, size, dtype, offset=offset, **kw),
                                  whole[offset:offset + size])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [5, rng_kernels.FEW_SEGMENTS + 40])
def test_segment_fills_equal_one_fill_per_segment_by_either_path(dtype, count) -> None:
    """A few segments are filled from Python, many by the compiled loop over segments (and
    one longer than a chunk as run() fills it): every segment as its own fill puts it."""
    from paramserver.numerics import rng

    sizes = np.random.default_rng(7).integers(0, 40, count)
    sizes[1] = 70_000  # longer than a chunk
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    keys = rng.param_keys(11, [f"p{i}" for i in range(count)])
    scale = np.linspace(0.5, 2.0, count)
    cases = [
        (rng.fill_uniform_segments, fill_uniform, (-scale, scale)),
        (rng.fill_normal_segments, fill_normal, (scale * 0.1, scale)),
        (rng.fill_truncated_normal_segments, fill_truncated_normal, (scale * 0, scale)),
    ]
    for fill_segments, fill, (p, q) in cases:
        out = np.full(int(sizes.sum()), np.nan, dtype)
        fill_segments(out, starts, sizes, keys, p, q)
        for s in range(count):
            one = np.empty(int(sizes[s]), dtype)
            fill(one, int(keys[s]), float(p[s]), float(q[s]))
            assert np.array_equal(out[starts[s]:starts[s] + sizes[s]], one), (fill, s)
    out = np.full(int(sizes.sum()), np.nan, dtype)
    rng.fill_constant_segments(out, starts, sizes, scale / 3)
    expected = np.repeat((scale / 3).astype(dtype), sizes)
    assert np.array_equal(out, expected)
