"""Param and ParamSet (SPEC §3): names, flat memory, sharing, gradients, versions, errors.

Initialisation statistics and seeding are in ``test_init.py``; updates in ``test_updaters.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from paramserver import Param, ParamError, ParamSet
from paramserver.config.job import ParamConf
from paramserver.params import ParamSpec


def spec(name: str, shape: tuple[int, ...] | int, place: str, **conf: object) -> ParamSpec:
    shape = (shape,) if isinstance(shape, int) else shape
    return ParamSpec(name, shape, ParamConf.parse({"name": name, **conf}), place)


# -- Param on its own ---------------------------------------------------------------------


def test_param_defaults() -> None:
    p = Param("w", (3, 4))
    assert p.name == "w" and p.shape == (3, 4) and p.size == 12
    assert p.dtype == np.float32
    assert p.data.shape == p.grad.shape == (3, 4)
    assert not np.shares_memory(p.data, p.grad)
    assert p.is_owner and p.owner is None and p.version == 0
    assert (p.lr_scale, p.wd_scale) == (1.0, 1.0)
    assert p.conf.name == "w" and p.conf.init.type == "kConstant"
    assert repr(p) == "Param('w', shape=(3, 4), dtype=float32, version=0)"


def test_param_shape_from_an_int_and_float64() -> None:
    p = Param("b", 5, np.float64)
    assert p.shape == (5,) and p.data.dtype == np.float64 and p.grad.dtype == np.float64


def test_fan_in_is_shape_1_and_fan_out_shape_0() -> None:
    p = Param("w", (7, 3))
    assert (p.fan_in, p.fan_out) == (3, 7)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), ()])
def test_fans_of_a_param_that_is_not_2d_are_refused(shape: tuple[int, ...]) -> None:
    p = Param("b", shape)
    with pytest.raises(ParamError, match=r"Param 'b' has shape .*: fan_in needs a 2-D Param"):
        _ = p.fan_in
    with pytest.raises(ParamError, match=r"fan_out needs a 2-D Param"):
        _ = p.fan_out


def test_param_errors() -> None:
    with pytest.raises(ParamError, match="Param dtype must be float32 or float64, not int32"):
        Param("w", 3, np.int32)
    with pytest.raises(ParamError, match=r"Param 'w': shape must be non-negative integers, "
                                         r"not \(2, -1\)"):
        Param("w", (2, -1))
    with pytest.raises(ParamError, match="shape must be non-negative integers"):
        Param("w", (2.0, 3))  # type: ignore[arg-type]


def test_param_given_memory_must_fit() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    p = Param("w", (2, 3), data=data)
    assert p.data is data
    with pytest.raises(ParamError, match=r"Param 'w': data has shape \(3, 2\), expected \(2, 3\)"):
        Param("w", (2, 3), data=data.reshape(3, 2))
    with pytest.raises(ParamError, match="Param 'w': grad has dtype float64, expected float32"):
        Param("w", (2, 3), grad=np.zeros((2, 3)))
    with pytest.raises(ParamError, match="Param 'w': data must be C-contiguous"):
        Param("w", (3, 2), data=data.T)


# -- ParamSet: flat buffers ---------------------------------------------------------------


def test_paramset_views_one_flat_buffer_per_role() -> None:
    ps = ParamSet([("w", (2, 3)), ("b", 3), ("v", (4, 1), {"lr_scale": 2.0})])
    assert ps.names == ["w", "b", "v"] and len(ps) == 3 and "b" in ps and "x" not in ps
    assert [p.name for p in ps] == ps.names
    assert ps.values.shape == (13,) and ps.grads.shape == (13,)
    assert ps.offsets.tolist() == [0, 6, 9, 13] and ps.offsets.dtype == np.int64
    for i, p in enumerate(ps.owners):
        lo, hi = ps.offsets[i], ps.offsets[i + 1]
        p.data[...] = i + 1
        p.grad[...] = -(i + 1)
        assert np.shares_memory(p.data, ps.values[lo:hi])
        assert np.all(ps.values[lo:hi] == i + 1) and np.all(ps.grads[lo:hi] == -(i + 1))
    assert ps.lr_scales.tolist() == [1.0, 1.0, 2.0] and ps.wd_scales.tolist() == [1.0] * 3
    assert ps.num_shares.tolist() == [1, 1, 1]
    assert ps.versions.tolist() == [0, 0, 0]
    ps.zero_grads()
    assert not ps.grads.any()
    assert repr(ps) == "ParamSet(3 params, 3 owners, 13 values, float32)"


def test_paramset_dtype() -> None:
    ps = ParamSet([("w", (2, 2))], dtype=np.float64)
    assert ps.values.dtype == ps["w"].data.dtype == ps["w"].grad.dtype == np.float64
    with pytest.raises(ParamError, match="Param dtype must be float32 or float64, not float16"):
        ParamSet([("w", 2)], dtype=np.float16)


def test_paramset_specs_as_tuples_confs_or_dicts() -> None:
    conf = ParamConf(lr_scale=3.0)
    ps = ParamSet([("a", 2, conf), ("b", 2, {"wd_scale": 0.5}), (None, 2, {"name": "c"})])
    assert ps.names == ["a", "b", "c"]
    assert ps["a"].lr_scale == 3.0 and ps["b"].wd_scale == 0.5
    assert ps["a"].conf.name == "a" and conf.name is None  # the caller's conf is not changed


def test_paramset_spec_errors() -> None:
    with pytest.raises(ParamError, match=r"param 1: expected \(name, shape\) or "
                                         r"\(name, shape, conf\)"):
        ParamSet([("a", 2), ("b",)])
    with pytest.raises(ParamError, match="param 0: a name is needed"):
        ParamSet([("", 2)])
    with pytest.raises(ParamError) as e:
        ParamSet([("a", 2, {"lr_scale": -1})])
    assert str(e.value) == ("value -1 for Parameter lr_scale should be greater equal to 0\n"
                            "lr_scale: Multiplied with the learning rate.")
    with pytest.raises(ParamError) as e:
        ParamSet([("a", 2, {"wd_scale": -0.5})])
    assert str(e.value) == ("value -0.5 for Parameter wd_scale should be greater equal to 0\n"
                            "wd_scale: Multiplied with the weight decay.")


def test_lookup_of_an_unknown_name_suggests_one() -> None:
    ps = ParamSet([("fc1_w", (2, 2)), ("fc1_b", 2)])
    with pytest.raises(ParamError, match="no Param named 'fc1_x'; did you mean 'fc1_"):
        ps["fc1_x"]
    with pytest.raises(ParamError, match=r"^no Param named 'zzz'$"):
        ps["zzz"]


def test_names_must_be_unique_and_the_error_names_both_places() -> None:
    specs = [spec("w", (2, 2), "layer 'fc1', param 0"), spec("b", 2, "layer 'fc1', param 1"),
             spec("w", (3, 3), "layer 'fc2', param 0")]
    with pytest.raises(ParamError) as e:
        ParamSet(specs)
    assert str(e.value) == ("Param name 'w' is used twice: layer 'fc1', param 0 and "
                            "layer 'fc2', param 0")


# -- sharing ------------------------------------------------------------------------------


def test_sharer_views_the_owners_values_and_keeps_its_own_gradient() -> None:
    ps = ParamSet([("w", (2, 3)), ("wt", (3, 2), {"share_from": "w"})])
    w, wt = ps["w"], ps["wt"]
    assert wt.owner is w and not wt.is_owner and w.is_owner
    assert wt.shape == (3, 2)  # the shape may differ, the count may not
    assert np.shares_memory(w.data, wt.data)
    assert not np.shares_memory(w.grad, wt.grad)
    w.data[...] = np.arange(6).reshape(2, 3)
    assert wt.data.ravel().tolist() == [0, 1, 2, 3, 4, 5]
    wt.data[2, 1] = 42.0
    assert w.data[1, 2] == 42.0
    assert ps.owners == [w] and ps.values.size == 6
    assert ps.grads.size == 12  # owners' gradients first, then the sharers'
    assert np.shares_memory(ps.owner_grads(), w.grad)
    assert not np.shares_memory(ps.owner_grads(), wt.grad)
    assert ps.num_shares.tolist() == [2]
    assert ps.owner_index("wt") == ps.owner_index("w") == 0
    assert repr(wt) == "Param('wt', shape=(3, 2), dtype=float32, version=0, owner='w')"


def test_sharer_takes_the_owners_configuration_keeping_its_name() -> None:
    owner = {"lr_scale": 2.0, "wd_scale": 0.5, "init": {"type": "kGaussian", "std": 0.1}}
    sharer = {"share_from": "a", "lr_scale": 7.0, "init": {"type": "kUniform"}}
    ps = ParamSet([("a", 4, owner), ("b", (2, 2), sharer)])
    a, b = ps["a"], ps["b"]
    assert b.conf.name == "b" and b.conf.share_from == "a"
    assert b.conf.init == a.conf.init and b.conf.init.type == "kGaussian"
    assert (b.lr_scale, b.wd_scale) == (2.0, 0.5)
    assert b.conf.init is not a.conf.init  # a copy: changing one does not change the other


def test_sharing_chains_resolve_to_the_first_owner() -> None:
    ps = ParamSet([("c", 6, {"share_from": "b"}), ("a", (2, 3), {"lr_scale": 3.0}),
                   ("b", (3, 2), {"share_from": "a"})])
    assert ps["b"].owner is ps["a"] and ps["c"].owner is ps["a"]
    assert ps["c"].lr_scale == 3.0 and ps["c"].conf.share_from == "a"
    assert [p.name for p in ps.owners] == ["a"] and ps.names == ["c", "a", "b"]
    assert ps.num_shares.tolist() == [3]
    assert np.shares_memory(ps["c"].data, ps["a"].data)


def test_sum_shared_grads_adds_every_sharers_gradient_into_its_owner() -> None:
    ps = ParamSet([("w", (2, 3)), ("wt", (3, 2), {"share_from": "w"}),
                   ("w2", 6, {"share_from": "wt"}), ("b", 2)])
    ps["w"].grad[...] = 1.0
    ps["wt"].grad[...] = np.arange(6).reshape(3, 2)
    ps["w2"].grad[...] = 10.0
    ps["b"].grad[...] = 5.0
    ps.sum_shared_grads()
    assert ps["w"].grad.ravel().tolist() == [11, 12, 13, 14, 15, 16]
    assert ps["b"].grad.tolist() == [5, 5]
    assert ps["wt"].grad.ravel().tolist() == [0, 1, 2, 3, 4, 5]  # sharers' own stay
    assert ps.num_shares.tolist() == [3, 1]


def test_only_owners_have_versions() -> None:
    ps = ParamSet([("w", 4), ("v", 4, {"share_from": "w"})])
    ps["w"].version = 3
    assert ps["v"].version == 3 and ps.versions.tolist() == [3]
    with pytest.raises(ParamError, match="Param 'v' shares 'w': its version is the owner's"):
        ps["v"].version = 1


def test_sharing_an_unknown_param_suggests_a_name() -> None:
    with pytest.raises(ParamError) as e:
        ParamSet([spec("fc1_w", (2, 2), "layer 'fc1', param 0"),
                  spec("fc2_w", (2, 2), "layer 'fc2', param 0", share_from="fc1_v")])
    assert str(e.value) == ("Param 'fc2_w' (layer 'fc2', param 0) shares from unknown Param "
                            "'fc1_v'; did you mean 'fc1_w'?")


def test_sharing_needs_equal_element_counts() -> None:
    with pytest.raises(ParamError) as e:
        ParamSet([("w", (2, 3)), ("v", (3, 3), {"share_from": "w"})])
    assert str(e.value) == ("Param 'v' (param 1) has shape (3, 3) (9 elements) but shares "
                            "from 'w' with shape (2, 3) (6 elements); the counts must be equal")


def test_share_from_cycles_are_refused_once_each() -> None:
    with pytest.raises(ParamError) as e:
        ParamSet([("a", 2, {"share_from": "b"}), ("b", 2, {"share_from": "a"})])
    assert str(e.value) == "share_from cycle: a -> b -> a"
    with pytest.raises(ParamError) as e:
        ParamSet([("a", 2, {"share_from": "a"})])
    assert str(e.value) == "share_from cycle: a -> a"
    # A chain that runs into a cycle: the cycle is reported once, as declared first.
    with pytest.raises(ParamError) as e:
        ParamSet([("x", 2, {"share_from": "c"}), ("b", 2, {"share_from": "c"}),
                  ("c", 2, {"share_from": "b"})])
    assert str(e.value) == "share_from cycle: b -> c -> b"


def test_every_sharing_problem_is_reported_at_once() -> None:
    with pytest.raises(ParamError) as e:
        ParamSet([("a", 2), ("a", 3), ("b", 5, {"share_from": "a"}),
                  ("c", 2, {"share_from": "nope"})])
    messages = [p.message for p in e.value.problems]
    assert len(messages) == 3
    assert messages[0] == "Param name 'a' is used twice: param 0 and param 1"
    assert messages[1].startswith("Param 'b' (param 2) has shape (5,) (5 elements)")
    assert messages[2] == "Param 'c' (param 3) shares from unknown Param 'nope'"
