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
from typing import Any, ClassVar, TypeVar

import numpy as np

from .config import ParamError, Parameter, field
from .config.components import param_generators
from .config.job import ParamGenConf, conf_from
from .params import Param, ParamSet

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
    generators: dict[int, ParamGenerator] = {}
    for p in params.owners:
        key = id(p.conf.init)
        gen = generators.get(key) or create_param_generator(p.conf.init)
        generators[key] = gen
        gen.fill(p, stream(seed, p.name, check_only))
        p.version = 0


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
    receptive = int(np.prod(param.shape[2:], dtype=np.int64))
    return param.shape[1] * receptive, param.shape[0] * receptive


def _fill_times(data: np.ndarray, scale: float, fill: Callable[[float], None]) -> None:
    """``fill(|scale|)``, negated when ``scale < 0``: exactly the fill for 1, × ``scale``.

    The random fills take a non-negative spread; negating afterwards keeps "then × value"
    true element by element for negative values too (not only in distribution).
    """
    fill(abs(scale))
    if scale < 0:
        np.negative(data, out=data)


@register_param_generator("kConstant", aliases=("kConst",))
class Constant(ParamGenerator):
    """Every element = ``value``."""

    fills_pieces = True

    #: Whether the method fills every element alike (``paramserver check`` warns of it for
    #: a Param of two or more dimensions, whose units would then stay equal).
    constant: ClassVar[bool] = True

    def fill(self, param: Param, rng: Stream) -> None:
        param.data.fill(self.conf.value)


class _Scaled(ParamGenerator):
    """A Gaussian or uniform fill multiplied by ``value × factor(fan_in, fan_out)``.

    ``fans``: the factor depends on the fans, and the Param must be 2-D (SPEC §4).
    """

    fills_pieces = True

    gaussian: ClassVar[bool]
    fans: ClassVar[bool] = False

    def factor(self, fan_in: int, fan_out: int) -> float:
        return 1.0

    def fill(self, param: Param, rng: Stream) -> None:
        c = self.conf
        factor = 1.0
        if self.fans:
            fan_in, fan_out = _fans(param, self.conf.component, exactly_2d=True)
            if param.size == 0:
                return  # no elements, and a zero fan would divide by zero
            factor = self.factor(fan_in, fan_out)
        data = param.data
        if self.gaussian:
            _fill_times(data, c.value * factor,
                        lambda s: rng.normal(data, c.mean * s, c.std * s))
        else:
            _fill_times(data, c.value * factor,
                        lambda s: rng.uniform(data, c.low * s, c.high * s))


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
class Zeros(ParamGenerator):
    """Every element = 0 (Keras' ``zeros``)."""

    fills_pieces = True

    constant = True
    fill_value = 0.0

    def fill(self, param: Param, rng: Stream) -> None:
        name = self.conf.component
        _refuse_common(self.conf, name, {"value": f"no value: {name} fills "
                                                  f"{self.fill_value:g}; use kConstant"})
        param.data.fill(self.fill_value)


@register_param_generator("ones")
class Ones(Zeros):
    """Every element = 1 (Keras' ``ones``)."""

    fill_value = 1.0


class NormalConf(Parameter):
    """Keras' spread of a normal fill (its mean is the common ``mean``)."""

    stddev: float = field(0.05, lower=0.0, finite=True,
                          doc="Standard deviation (Keras' default, 0.05).")


@register_param_generator("random_normal")
class RandomNormal(ParamGenerator):
    """N(mean, stddev), then × ``value`` (Keras' ``random_normal``; stddev 0.05)."""

    fills_pieces = True

    Config = NormalConf

    def fill(self, param: Param, rng: Stream) -> None:
        c = self.conf
        _refuse_common(c, c.component, {"std": "stddev", "low": "mean and stddev",
                                        "high": "mean and stddev"})
        data = param.data
        sd = self.own.stddev
        _fill_times(data, c.value, lambda s: rng.normal(data, c.mean * s, sd * s))


@register_param_generator("truncated_normal")
class TruncatedNormal(ParamGenerator):
    """N(mean, stddev) kept within two stddev of the mean (values beyond are drawn again),
    then × ``value`` (Keras' ``truncated_normal``; stddev 0.05)."""

    fills_pieces = True

    Config = NormalConf

    def fill(self, param: Param, rng: Stream) -> None:
        c = self.conf
        _refuse_common(c, c.component, {"std": "stddev", "low": "mean and stddev",
                                        "high": "mean and stddev"})
        data = param.data
        sd = self.own.stddev
        _fill_times(data, c.value,
                    lambda s: rng.truncated_normal(data, c.mean * s, sd * s))


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
class RandomUniform(ParamGenerator):
    """U[minval, maxval), then × ``value`` (Keras' ``random_uniform``; ±0.05)."""

    fills_pieces = True

    Config = UniformConf

    def fill(self, param: Param, rng: Stream) -> None:
        c = self.conf
        _refuse_common(c, c.component, {"low": "minval", "high": "maxval",
                                        "mean": "minval and maxval", "std": "minval and maxval"})
        data = param.data
        lo, hi = self.own.minval, self.own.maxval
        _fill_times(data, c.value, lambda s: rng.uniform(data, lo * s, hi * s))


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


class _VarianceScaling(ParamGenerator):
    """Zero-mean fills of variance ``scale / n`` (Keras' ``variance_scaling``), × ``value``.

    Subclasses fix ``scale``, ``mode`` and ``distribution`` (the Keras names built on it);
    ``variance_scaling`` reads them from its own configuration.
    """

    fills_pieces = True

    scale: ClassVar[float] = 1.0
    mode: ClassVar[str] = "fan_in"
    distribution: ClassVar[str] = "truncated_normal"

    def settings(self) -> tuple[float, str, str]:
        return self.scale, self.mode, self.distribution

    def fill(self, param: Param, rng: Stream) -> None:
        c = self.conf
        _refuse_common(c, c.component, {"mean": "no mean: the fill is centred on 0",
                                        "std": "no std: the spread follows from the fans",
                                        "low": "no low: the bounds follow from the fans",
                                        "high": "no high: the bounds follow from the fans"})
        fan_in, fan_out = _fans(param, c.component)
        if param.size == 0:
            return
        scale, mode, distribution = self.settings()
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        data = param.data
        if distribution == "uniform":
            limit = math.sqrt(3.0 * scale / n)
            _fill_times(data, c.value, lambda a: rng.uniform(data, -limit * a, limit * a))
        elif distribution == "untruncated_normal":
            sd = math.sqrt(scale / n)
            _fill_times(data, c.value, lambda a: rng.normal(data, 0.0, sd * a))
        else:
            sd = math.sqrt(scale / n) / TRUNCATED_STD
            _fill_times(data, c.value, lambda a: rng.truncated_normal(data, 0.0, sd * a))


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

    path: str = field(doc="A safetensors file (an exported model, a torch or Hugging Face "
                          "one); relative paths start at the working folder.")
    key: str | None = field(None, doc="The tensor's name in the file (default: the Param's "
                                      "name).")


@register_param_generator("kFromFile", aliases=("from_file",))
class FromFile(ParamGenerator):
    """The values of a tensor in a safetensors file, by the Param's name (or ``key``).

    Reads ``paramserver export``'s files and any other safetensors file (torch's, Hugging
    Face's) by memory map; the tensor must have the Param's shape, and is converted to the
    Param's dtype. The common fields (``value``, ``std``, ...) are not used.
    """

    Config = FromFileConf

    def fill(self, param: Param, rng: Stream) -> None:
        own: FromFileConf = self.own
        key = own.key or param.name
        param.data[...] = read_tensor(own.path, key, param.shape, param.name)


def read_tensor(path: str, key: str, shape: tuple[int, ...], param: str) -> np.ndarray:
    """The tensor ``key`` of the safetensors file ``path``, checked against ``shape``.

    Raises:
        ParamError: naming the file and what is wrong (missing file or key, with the closest
            names; another shape; not a safetensors file).
    """
    import difflib

    from safetensors import SafetensorError, safe_open

    where = f"init of Param '{param}': file '{path}'"
    if not os.path.isfile(path):
        raise ParamError(f"{where} does not exist (relative paths start at the working "
                         f"folder, {os.getcwd()})")
    try:
        with safe_open(path, framework="np") as f:
            names = list(f.keys())
            array = f.get_tensor(key) if key in names else None
    except (SafetensorError, OSError, TypeError, ValueError) as e:
        raise ParamError(f"{where} cannot be read as safetensors ({e})") from None
    if array is None:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        raise ParamError(f"{where} has no tensor '{key}'{hint} (it holds {shown})")
    if tuple(array.shape) != tuple(shape):
        raise ParamError(f"{where}: tensor '{key}' has shape {tuple(array.shape)}, the Param "
                         f"{tuple(shape)}")
    if array.dtype.kind not in "biuf":
        raise ParamError(f"{where}: tensor '{key}' holds {array.dtype}, not numbers")
    return np.asarray(array)


def is_constant(conf: ParamGenConf) -> bool:
    """Whether an ``init`` fills every element alike (kConstant, zeros, ones)."""
    return bool(getattr(param_generators.get(conf.component), "constant", False))


__all__ = ["FromFile", "FromFileConf", "ParamGenerator", "Stream", "create_param_generator",
           "fill_range", "is_constant", "read_tensor", "register_param_generator", "stream"]
