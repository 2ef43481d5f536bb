"""Initialisation methods (SPEC §4) and the ``fill(param, rng)`` interface users extend.

Every method reads the common fields of ``init { ... }`` (``value``, ``mean``, ``std``,
``low``, ``high``); a user's method may declare its own ``Config``, read from the extension
block ``[<name>_conf] { ... }``.

Seeding: each Param draws from its own counter-based stream whose key is a stable hash of
``(job seed, Param name)``; element ``i`` of a fill is a function of ``(key, i)`` alone. So
one seed gives the same values on every run, whatever the number of threads, workers or
servers, and whatever the order Params are made in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import numpy as np

from .config import ParamError, Parameter, field
from .config.components import param_generators
from .config.job import ParamGenConf, conf_from
from .params import Param, ParamSet
from .paths import require_regular, shown

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class Stream:
    """The random stream of one Param: fast fills keyed by ``key``, or a NumPy generator.

    ``offset`` is the stream position of the first value filled: a fill of a piece of a
    Param (a server's rows of a table) starting at its position gives the values a fill of
    the whole Param gives there. With ``check_only`` the fills check their arguments and
    write nothing (``paramserver check``: numba is not loaded)."""

    key: int
    offset: int = 0
    check_only: bool = False

    def uniform(self, out: np.ndarray, low: float = -1.0, high: float = 1.0) -> None:
        """Fill ``out`` with U[low, high)."""
        from .numerics.rng import fill_uniform

        fill_uniform(out, self.key, low, high, offset=self.offset, check_only=self.check_only)

    def normal(self, out: np.ndarray, mean: float = 0.0, std: float = 1.0) -> None:
        """Fill ``out`` with N(mean, std²)."""
        from .numerics.rng import fill_normal

        fill_normal(out, self.key, mean, std, offset=self.offset, check_only=self.check_only)

    def truncated_normal(self, out: np.ndarray, mean: float = 0.0, std: float = 1.0,
                         a: float = -2.0, b: float = 2.0) -> None:
        """Fill ``out`` with N(mean, std²) kept within [mean + a·std, mean + b·std]."""
        from .numerics.rng import fill_truncated_normal

        fill_truncated_normal(out, self.key, mean, std, a, b, offset=self.offset,
                              check_only=self.check_only)

    def numpy(self) -> np.random.Generator:
        """A NumPy generator on the same key, for fills the fast ones do not cover."""
        if self.offset:
            raise ParamError("a NumPy generator fills whole Params only (not a piece)")
        return np.random.Generator(np.random.Philox(key=self.key))


def stream(seed: int, name: str, check_only: bool = False) -> Stream:
    """The stream of Param ``name`` in a job seeded with ``seed`` (``check_only``: see
    :class:`Stream`)."""
    from .numerics.rng import param_key

    return Stream(param_key(seed, name), check_only=check_only)


class ParamGenerator:
    """Base of initialisation methods: ``fill(param, rng)`` writes ``param.data``.

    Args:
        conf: the ``init`` configuration; ``conf.own`` is the method's own ``Config``
            instance (None for methods without one).
    """

    Config: ClassVar[type[Parameter] | None] = None
    #: Whether :meth:`fill` can fill a piece of a Param (element ``i`` a function of the
    #: stream and ``i`` alone: the built-in random and constant fills), so that servers fill
    #: their own pieces of a table (:func:`fill_range`).
    fills_pieces: ClassVar[bool] = False

    def __init__(self, conf: ParamGenConf):
        self.conf = conf
        self.own: Any = conf.own

    def fill(self, param: Param, rng: Stream) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.conf!r})"


def register_param_generator(name: str, *, aliases: tuple[str, ...] = ()
                             ) -> Callable[[T], T]:
    """Register an initialisation method class under ``name`` (SPEC §8)."""
    return param_generators.register(name, aliases=aliases)  # type: ignore[return-value]


def create_param_generator(x: ParamGenConf | dict[str, Any] | str) -> ParamGenerator:
    """An initialisation method from its configuration, a nested dict, or an ``init`` block."""
    conf = conf_from(ParamGenConf, x, "init")
    generator: ParamGenerator = param_generators.get(conf.component)(conf)
    return generator


def init_params(params: ParamSet, seed: int = 0, *, check_only: bool = False) -> None:
    """Initialise every owner of a ParamSet with its method; the same seed gives the same
    values always.

    Each Param draws from its own stream, keyed by ``(seed, name)``, so values do not depend
    on the order Params are made in, nor on threads, workers or servers. Sharers see their
    owner's values; every owner's version goes back to 0.

    The Params of one built-in method and one shape take one draw, and each distribution is
    filled for the whole set in one compiled call (values exactly those of a fill of each
    Param): a million small Params initialise in seconds, not a call per Param.

    Args:
        params: the Params; each owner's ``init { }`` configuration chooses its method.
        seed: the job's seed, an int in ``[0, 2**64)``.
        check_only: check every owner's method against it (its arguments, the Param's
            shape, a file's tensor) and draw nothing at random: the random fills write
            nothing and numba is not loaded (``paramserver check``).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not (
            0 <= seed < 1 << 64):
        raise ParamError(f"seed must be an int in [0, 2**64), not {seed!r}")
    from .numerics.rng import param_keys

    owners = params.owners
    keys = param_keys(int(seed), [p.name for p in owners])
    # The owners by method and shape: one draw serves each group. A job file gives every
    # Param an init block of its own, so built-in methods are told apart by what their
    # configurations say; a user's method keeps one instance per configuration object.
    methods: dict[int, Any] = {}
    groups: dict[tuple[Any, tuple[int, ...], bool], list[int]] = {}
    for i, p in enumerate(owners):
        init = p.init_conf
        method = methods.get(id(init))
        if method is None:
            method = methods[id(init)] = _method_key(init)
        if type(method) is int and not p._own_conf:  # a user's method, a shared configuration:
            method = ("param", i)  # an instance per Param, as each had a copy of its own
        groups.setdefault((method, p.shape, p.row_sparse), []).append(i)
    generators: dict[Any, ParamGenerator] = {}
    draws = _Draws()
    for (method, _, table), group in groups.items():
        first = owners[group[0]]
        gen = generators.get(method)
        if gen is None:
            gen = generators[method] = create_param_generator(first.init_conf)
        if table or not _draws(type(gen)):
            for i in group:  # a method of its own fill (or a table, which may not be held)
                gen.fill(owners[i], Stream(int(keys[i]), check_only=check_only))
        elif check_only:  # one of the group checks them all (one method, one shape)
            gen.fill(first, Stream(int(keys[group[0]]), check_only=True))
        else:
            draws.add(group, cast(_Drawn, gen).draw(first))
    if not check_only:
        draws.fill(params.values, params.offsets, keys)
    params.set_versions(0)


def _draws(cls: type) -> bool:
    """Whether a method's fill is its draw (:class:`_Drawn`'s, not one of its own)."""
    return issubclass(cls, _Drawn) and cls.fill is _Drawn.fill


def _method_key(conf: ParamGenConf) -> Any:
    """What tells an ``init`` configuration's method apart: its content, for a built-in
    method whose fill is its draw; the object itself, for any other."""
    try:
        if _draws(param_generators.get(conf.component)):
            key = _content(conf)
            hash(key)
            return key
    except (ParamError, TypeError):
        pass  # an unknown method (create_param_generator says so), or a value of no key
    return id(conf)


def _content(value: Any) -> Any:
    """A key equal for equal configurations (floats by their bits: -0.0 is not 0.0)."""
    if isinstance(value, Parameter):
        return (type(value), tuple((k, _content(v)) for k, v in value.__dict__.items()))
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_content(v) for v in value))
    return (type(value), value)


class _Draws:
    """The draws of many groups of Params, each group one draw of :meth:`_Drawn.draw`; filled
    with one call per distribution."""

    def __init__(self) -> None:
        self.parts: dict[str, list[tuple[list[int], float, float, bool]]] = {}

    def add(self, group: list[int], drawn: tuple[str, float, float, float] | None) -> None:
        if drawn is not None:
            kind, a, b, scale = drawn
            s = abs(scale)  # as _fill_times draws: the spread for |scale|, then the sign
            self.parts.setdefault(kind, []).append((group, a * s, b * s, scale < 0))

    def fill(self, values: np.ndarray, offsets: np.ndarray, keys: np.ndarray) -> None:
        from .numerics import rng

        for kind, parts in self.parts.items():
            counts = [len(g) for g, _, _, _ in parts]
            at = np.fromiter((i for g, _, _, _ in parts for i in g), np.int64, sum(counts))
            starts, sizes = offsets[at], offsets[at + 1] - offsets[at]
            a = np.repeat([x for _, x, _, _ in parts], counts)
            b = np.repeat([x for _, _, x, _ in parts], counts)
            if kind == "constant":
                rng.fill_constant_segments(values, starts, sizes, a)
            else:
                getattr(rng, f"fill_{kind}_segments")(values, starts, sizes, keys[at], a, b)
            for group, _, _, negative in parts:
                for i in group if negative else ():
                    piece = values[offsets[i]:offsets[i + 1]]
                    np.negative(piece, out=piece)


@dataclass(frozen=True)
class _Piece:
    """What a fill sees of a piece of a Param: the whole's name, shape and size, the piece's
    memory as ``data``."""

    name: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def fill_range(generator: ParamGenerator, name: str, shape: tuple[int, ...], out: np.ndarray,
               offset: int, seed: int = 0) -> None:
    """Fill ``out`` with values ``offset:offset + out.size`` of a Param ``name`` of ``shape``,
    exactly as :func:`init_params` with ``seed`` fills them in the whole Param.

    Raises:
        ParamError: for a method that fills whole Params only (``fills_pieces`` False).
    """
    if not generator.fills_pieces:
        raise ParamError(f"init method {generator.conf.component} fills whole Params only, "
                         f"not a server's piece of '{name}': give the values instead")
    from .numerics.rng import param_key

    generator.fill(_Piece(name, tuple(shape), out),  # type: ignore[arg-type]
                   Stream(param_key(seed, name), int(offset)))


def _fans(param: Param, method: str, *, exactly_2d: bool = False) -> tuple[int, int]:
    """``(fan_in, fan_out)``: ``(shape[1], shape[0])``, times the receptive field of N-D Params.

    SINGA's fan methods (``exactly_2d``) take 2-D Params only; the others any N >= 2.
    """
    ndim = len(param.shape)
    if (ndim != 2) if exactly_2d else (ndim < 2):
        need = "a 2-D Param" if exactly_2d else "a Param of 2 or more dimensions"
        raise ParamError(f"Param '{param.name}' has shape {param.shape}: {method} needs {need} "
                         "(fan_in = shape[1], fan_out = shape[0])")
    receptive = math.prod(param.shape[2:])
    return param.shape[1] * receptive, param.shape[0] * receptive


def _fill_times(data: np.ndarray, scale: float, fill: Callable[[float], None]) -> None:
    """``fill(|scale|)``, negated when ``scale < 0``: exactly the fill for 1, × ``scale``.

    The random fills take a non-negative spread; negating afterwards keeps "then × value"
    true element by element for negative values too (not only in distribution).
    """
    fill(abs(scale))
    if scale < 0:
        np.negative(data, out=data)


class _Drawn(ParamGenerator):
    """A built-in fill: one distribution whose parameters follow from the configuration and
    the Param's shape alone (:meth:`draw`). :meth:`fill` fills one Param with it;
    :func:`init_params` fills every Param of one method and shape with one draw, and many
    at once (a million small Params would otherwise cost a call each)."""

    fills_pieces = True

    def draw(self, param: Param) -> tuple[str, float, float, float] | None:
        """``(kind, a, b, scale)`` for ``param``: the fill is ``kind``'s distribution
        (``"constant"``: every element ``a``; ``"uniform"``: U[a, b); ``"normal"``: N(a, b²);
        ``"truncated_normal"``: N(a, b²) within two ``b`` of ``a``) with ``a`` and ``b``
        times ``|scale|``, negated where ``scale < 0`` (so "then × value" holds element by
        element); None: there is nothing to fill. Raises for a Param the method does not
        take."""
        raise NotImplementedError

    def fill(self, param: Param, rng: Stream) -> None:
        drawn = self.draw(param)
        if drawn is None:
            return
        kind, a, b, scale = drawn
        data = param.data
        if kind == "constant":
            data.fill(a)
            return
        fill = getattr(rng, kind)
        _fill_times(data, scale, lambda s: fill(data, a * s, b * s))


@register_param_generator("kConstant", aliases=("kConst",))
class Constant(_Drawn):
    """Every element = ``value``."""

    #: Whether the method fills every element alike (``paramserver check`` warns of it for
    #: a Param of two or more dimensions, whose units would then stay equal).
    constant: ClassVar[bool] = True

    def draw(self, param: Param) -> tuple[str, float, float, float]:
        return "constant", self.conf.value, 0.0, 1.0


class _Scaled(_Drawn):
    """A Gaussian or uniform fill multiplied by ``value × factor(fan_in, fan_out)``.

    ``fans``: the factor depends on the fans, and the Param must be 2-D (SPEC §4).
    """

    gaussian: ClassVar[bool]
    fans: ClassVar[bool] = False

    def factor(self, fan_in: int, fan_out: int) -> float:
        return 1.0

    def draw(self, param: Param) -> tuple[str, float, float, float] | None:
        c = self.conf
        factor = 1.0
        if self.fans:
            fan_in, fan_out = _fans(param, self.conf.component, exactly_2d=True)
            if param.size == 0:
                return None  # no elements, and a zero fan would divide by zero
            factor = self.factor(fan_in, fan_out)
        if self.gaussian:
            return "normal", c.mean, c.std, c.value * factor
        return "uniform", c.low, c.high, c.value * factor


@register_param_generator("kGaussian", aliases=("normal",))
class Gaussian(_Scaled):
    """N(mean, std), then × ``value``."""

    gaussian = True


@register_param_generator("kUniform", aliases=("uniform",))
class Uniform(_Scaled):
    """U[low, high), then × ``value``."""

    gaussian = False


@register_param_generator("kGaussianSqrtFanIn")
class GaussianSqrtFanIn(_Scaled):
    """kGaussian, then × 1/sqrt(fan_in); fan_in = shape[1] of a 2-D Param."""

    gaussian = True
    fans = True

    def factor(self, fan_in: int, fan_out: int) -> float:
        return 1.0 / math.sqrt(fan_in)


@register_param_generator("kUniformSqrtFanIn")
class UniformSqrtFanIn(_Scaled):
    """kUniform, then × sqrt(3/fan_in); fan_in = shape[1] of a 2-D Param."""

    gaussian = False
    fans = True

    def factor(self, fan_in: int, fan_out: int) -> float:
        return math.sqrt(3.0 / fan_in)


@register_param_generator("kUniformSqrtFanInOut", aliases=("kUniformFanInOut",))
class UniformSqrtFanInOut(_Scaled):
    """kUniform, then × sqrt(6/(fan_in + fan_out)) (Glorot's factor; SPEC §4 Decision)."""

    gaussian = False
    fans = True

    def factor(self, fan_in: int, fan_out: int) -> float:
        return math.sqrt(6.0 / (fan_in + fan_out))


def _refuse_common(conf: ParamGenConf, method: str, fields: dict[str, str]) -> None:
    """Refuse common fields of ``init { }`` that ``method`` does not read, when set: the
    Keras methods name their own (``stddev``, ``minval``, ...), and a SINGA spelling would
    otherwise be passed over without a word."""
    defaults = type(conf).fields()
    given = [k for k in fields if getattr(conf, k) != defaults[k].make_default()]
    if given:
        raise ParamError("; ".join(f"{method} does not read {k} (it reads {fields[k]})"
                                   for k in given))


@register_param_generator("zeros", aliases=("zero",))
class Zeros(_Drawn):
    """Every element = 0 (Keras' ``zeros``)."""

    constant = True
    fill_value = 0.0

    def draw(self, param: Param) -> tuple[str, float, float, float]:
        name = self.conf.component
        _refuse_common(self.conf, name, {"value": f"no value: {name} fills "
                                                  f"{self.fill_value:g}; use kConstant"})
        return "constant", self.fill_value, 0.0, 1.0


@register_param_generator("ones")
class Ones(Zeros):
    """Every element = 1 (Keras' ``ones``)."""

    fill_value = 1.0


class NormalConf(Parameter):
    """Keras' spread of a normal fill (its mean is the common ``mean``)."""

    stddev: float = field(0.05, lower=0.0, finite=True,
                          doc="Standard deviation (Keras' default, 0.05).")


@register_param_generator("random_normal")
class RandomNormal(_Drawn):
    """N(mean, stddev), then × ``value`` (Keras' ``random_normal``; stddev 0.05)."""

    Config = NormalConf
    kind = "normal"

    def draw(self, param: Param) -> tuple[str, float, float, float]:
        c = self.conf
        _refuse_common(c, c.component, {"std": "stddev", "low": "mean and stddev",
                                        "high": "mean and stddev"})
        return self.kind, c.mean, self.own.stddev, c.value


@register_param_generator("truncated_normal")
class TruncatedNormal(RandomNormal):
    """N(mean, stddev) kept within two stddev of the mean (values beyond are drawn again),
    then × ``value`` (Keras' ``truncated_normal``; stddev 0.05)."""

    kind = "truncated_normal"


class UniformConf(Parameter):
    """Keras' bounds of a uniform fill."""

    minval: float = field(-0.05, finite=True, doc="Lower bound (Keras' default, -0.05).")
    maxval: float = field(0.05, finite=True, doc="Upper bound (Keras' default, 0.05).")

    def check(self) -> list[str]:
        if self.minval > self.maxval:
            return [f"minval ({self.minval:g}) must not be greater than maxval "
                    f"({self.maxval:g})"]
        return []


@register_param_generator("random_uniform")
class RandomUniform(_Drawn):
    """U[minval, maxval), then × ``value`` (Keras' ``random_uniform``; ±0.05)."""

    Config = UniformConf

    def draw(self, param: Param) -> tuple[str, float, float, float]:
        c = self.conf
        _refuse_common(c, c.component, {"low": "minval", "high": "maxval",
                                        "mean": "minval and maxval", "std": "minval and maxval"})
        return "uniform", self.own.minval, self.own.maxval, c.value


#: The standard deviation of N(0, 1) truncated to [-2, 2]; Keras divides by it so that a
#: truncated fill keeps the variance asked for.
TRUNCATED_STD = 0.87962566103423978

_FAN_MODES = ("fan_in", "fan_out", "fan_avg")
_DISTRIBUTIONS = ("truncated_normal", "untruncated_normal", "uniform")


class VarianceScalingConf(Parameter):
    """Keras' ``variance_scaling``: a fill of variance ``scale / n``."""

    scale: float = field(1.0, lower=0.0, lower_exclusive=True, finite=True,
                         doc="The variance times n.")
    mode: str = field("fan_in", enum=_FAN_MODES,
                      doc="n: fan_in, fan_out or their mean, fan_avg.")
    distribution: str = field("truncated_normal", enum=_DISTRIBUTIONS,
                              doc="truncated_normal (within two standard deviations, "
                                  "rescaled to keep the variance), untruncated_normal or "
                                  "uniform.")


class _VarianceScaling(_Drawn):
    """Zero-mean fills of variance ``scale / n`` (Keras' ``variance_scaling``), × ``value``.

    Subclasses fix ``scale``, ``mode`` and ``distribution`` (the Keras names built on it);
    ``variance_scaling`` reads them from its own configuration.
    """

    scale: ClassVar[float] = 1.0
    mode: ClassVar[str] = "fan_in"
    distribution: ClassVar[str] = "truncated_normal"

    def settings(self) -> tuple[float, str, str]:
        return self.scale, self.mode, self.distribution

    def draw(self, param: Param) -> tuple[str, float, float, float] | None:
        c = self.conf
        _refuse_common(c, c.component, {"mean": "no mean: the fill is centred on 0",
                                        "std": "no std: the spread follows from the fans",
                                        "low": "no low: the bounds follow from the fans",
                                        "high": "no high: the bounds follow from the fans"})
        fan_in, fan_out = _fans(param, c.component)
        if param.size == 0:
            return None
        scale, mode, distribution = self.settings()
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        if distribution == "uniform":
            limit = math.sqrt(3.0 * scale / n)
            return "uniform", -limit, limit, c.value
        if distribution == "untruncated_normal":
            return "normal", 0.0, math.sqrt(scale / n), c.value
        return "truncated_normal", 0.0, math.sqrt(scale / n) / TRUNCATED_STD, c.value


@register_param_generator("variance_scaling")
class VarianceScaling(_VarianceScaling):
    """Zero-mean fill of variance ``scale / n``, n = fan_in, fan_out or their mean, from a
    truncated normal (rescaled), a normal or a uniform distribution; × ``value``."""

    Config = VarianceScalingConf

    def settings(self) -> tuple[float, str, str]:
        return self.own.scale, self.own.mode, self.own.distribution


@register_param_generator("glorot_uniform", aliases=("xavier_uniform",))
class GlorotUniform(_VarianceScaling):
    """U(-a, a), a = value · sqrt(6/(fan_in + fan_out)) (Glorot & Bengio 2010; Keras' and
    torch's)."""

    mode, distribution = "fan_avg", "uniform"


@register_param_generator("glorot_normal")
class GlorotNormal(_VarianceScaling):
    """Keras' glorot_normal: truncated normal of std value · sqrt(2/(fan_in + fan_out))."""

    mode = "fan_avg"


@register_param_generator("xavier_normal")
class XavierNormal(_VarianceScaling):
    """torch's xavier_normal_: N(0, s), s = value · sqrt(2/(fan_in + fan_out)), untruncated."""

    mode, distribution = "fan_avg", "untruncated_normal"


@register_param_generator("he_uniform", aliases=("kaiming_uniform",))
class HeUniform(_VarianceScaling):
    """U(-b, b), b = value · sqrt(6/fan_in) (He et al. 2015; Keras' and torch's for ReLU)."""

    scale, distribution = 2.0, "uniform"


@register_param_generator("he_normal")
class HeNormal(_VarianceScaling):
    """Keras' he_normal: truncated normal of std value · sqrt(2/fan_in)."""

    scale = 2.0


@register_param_generator("kaiming_normal")
class KaimingNormal(_VarianceScaling):
    """torch's kaiming_normal_ (ReLU): N(0, s), s = value · sqrt(2/fan_in), untruncated."""

    scale, distribution = 2.0, "untruncated_normal"


@register_param_generator("lecun_uniform")
class LecunUniform(_VarianceScaling):
    """U(-b, b), b = value · sqrt(3/fan_in) (Keras' lecun_uniform)."""

    distribution = "uniform"


@register_param_generator("lecun_normal")
class LecunNormal(_VarianceScaling):
    """Keras' lecun_normal: truncated normal of std value · sqrt(1/fan_in)."""


@register_param_generator("orthogonal")
class Orthogonal(ParamGenerator):
    """A (semi-)orthogonal matrix × ``value`` (Saxe et al. 2014; Keras' gain is ``value``);
    trailing dims flattened."""

    def fill(self, param: Param, rng: Stream) -> None:
        _fans(param, self.conf.component)
        if param.size == 0:
            return
        rows = param.shape[0]
        cols = param.size // rows
        a = rng.numpy().standard_normal((max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(a)
        q *= np.sign(np.diag(r))  # a unique, uniformly distributed factor
        if rows < cols:
            q = q.T
        param.data[...] = (self.conf.value * q).reshape(param.shape)


@register_param_generator("identity", aliases=("eye",))
class Identity(ParamGenerator):
    """The identity matrix (ones on the diagonal of a 2-D Param, also a rectangular one),
    × ``value`` (Keras' gain)."""

    def fill(self, param: Param, rng: Stream) -> None:
        if len(param.shape) != 2:
            raise ParamError(f"Param '{param.name}' has shape {param.shape}: identity needs a "
                             "2-D Param")
        data = param.data
        data.fill(0)
        np.fill_diagonal(data, self.conf.value)


class FromFileConf(Parameter):
    """Where kFromFile reads a Param's values."""

    path: str = field(path=True,
                      doc="A safetensors file (an exported model, a torch or Hugging Face "
                          "one); relative paths start at the working folder.")
    key: str | None = field(None, doc="The tensor's name in the file (default: the Param's "
                                      "name).")


@register_param_generator("kFromFile", aliases=("from_file",))
class FromFile(ParamGenerator):
    """The values of a tensor in a safetensors file, by the Param's name (or ``key``).

    Reads ``paramserver export``'s files and any other safetensors file (torch's, Hugging
    Face's; bfloat16 and float16 too); the tensor must have the Param's shape and finite
    values, and is converted to the Param's dtype. The common fields (``value``, ``std``,
    ...) are not used.
    """

    Config = FromFileConf

    def fill(self, param: Param, rng: Stream) -> None:
        own: FromFileConf = self.own
        key = own.key or param.name
        param.data[...] = read_tensor(own.path, key, param.shape, param.name, param.dtype)


#: The dtypes (safetensors' names) kFromFile reads: those numpy holds, and bfloat16 (decoded
#: to float32 exactly). Others (float8, complex, ...) are refused by name.
TENSOR_DTYPES = ("BOOL", "U8", "U16", "U32", "U64", "I8", "I16", "I32", "I64", "F16", "BF16",
                 "F32", "F64")


def read_tensor(path: str, key: str, shape: tuple[int, ...], param: str,
                dtype: Any = None) -> np.ndarray:
    """The tensor ``key`` of the safetensors file ``path``, checked against ``shape``.

    The shape and dtype are read from the file's header and compared with the Param's
    before any value is read; bfloat16 values are decoded to float32, other dtypes of
    :data:`TENSOR_DTYPES` read as they are, then converted to ``dtype`` (if given); floating
    values must be finite (after the conversion: 1e300 is not a float32).

    Raises:
        ParamError: naming the file and what is wrong (missing file or key, with the closest
            names; another shape; an unsupported dtype; NaN or infinite values; not a
            regular file, or not a safetensors file).
    """
    import difflib

    from safetensors import safe_open

    where = f"init of Param '{param}': file {shown(path)}"
    if require_regular(path, f"init of Param '{param}': file") is None:
        raise ParamError(f"{where} does not exist (relative paths start at the working "
                         f"folder, {os.getcwd()})")
    try:
        with safe_open(path, framework="np") as f:
            names = list(f.keys())
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                held = ", ".join(shown(n, 60) for n in names[:10]) + (
                    ", ..." if len(names) > 10 else "")
                raise ParamError(f"{where} has no tensor '{shown(key)}'{hint} (it holds "
                                 f"{held})")
            piece = f.get_slice(key)
            stored, found = str(piece.get_dtype()), tuple(int(d) for d in piece.get_shape())
            if found != tuple(shape):
                raise ParamError(f"{where}: tensor '{key}' has shape {found}, the Param "
                                 f"{tuple(shape)}")
            if stored not in TENSOR_DTYPES:
                raise ParamError(f"{where}: tensor '{key}' holds {stored}, which kFromFile "
                                 f"does not read (it reads {', '.join(TENSOR_DTYPES)})")
            array = (_bfloat16_tensor(path, key, found) if stored == "BF16"
                     else np.asarray(f.get_tensor(key)))
    except ParamError:
        raise
    # The reader parses untrusted bytes: whatever it raises (SafetensorError for a bad
    # header or sizes, OSError, ...) means this file is not a readable safetensors file.
    except Exception as e:
        raise ParamError(f"{where} cannot be read as safetensors ({type(e).__name__}: "
                         f"{shown(str(e))})") from None
    _check_finite(array, f"{where}: tensor '{key}' holds", "NaN or infinite")
    if dtype is not None and array.dtype != np.dtype(dtype):
        with np.errstate(over="ignore", invalid="ignore"):
            array = array.astype(dtype)
        _check_finite(array, f"{where}: tensor '{key}' holds",
                      f"beyond the range of the Param's {np.dtype(dtype).name}")
    return array


def _check_finite(array: np.ndarray, text: str, what: str) -> None:
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = np.flatnonzero(~np.isfinite(array.reshape(-1)))
        first = np.unravel_index(int(bad[0]), array.shape) if array.ndim else ()
        raise ParamError(f"{text} {bad.size:,} value(s) {what} (the first at index "
                         f"{tuple(int(i) for i in first)}); a Param starts from finite values")


def _bfloat16_tensor(path: str, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of the bfloat16 tensor ``key`` (numpy has no bfloat16): its bytes
    read where the file's header says (already checked by safetensors' own reader to lie
    inside the file), decoded exactly."""
    import json

    from .numerics.quant import bf16_decode

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        start, stop = (int(x) for x in header[key]["data_offsets"])
        f.seek(8 + size + start)
        bits = np.frombuffer(f.read(stop - start), "<u2")
    return bf16_decode(bits).reshape(shape)


def is_constant(conf: ParamGenConf) -> bool:
    """Whether an ``init`` fills every element alike (kConstant, zeros, ones)."""
    return bool(getattr(param_generators.get(conf.component), "constant", False))


__all__ = ["TENSOR_DTYPES", "FromFile", "FromFileConf", "ParamGenerator", "Stream",
           "create_param_generator", "fill_range", "is_constant", "read_tensor",
           "register_param_generator", "stream"]
