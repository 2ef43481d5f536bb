"""The job schema: what a SINGA job file (``job.conf``) holds, as declarations.

Field names, defaults and nesting follow SINGA's ``job.proto`` so that a SINGA user's file
reads as written; where we differ the SPEC says why. Each component block (``init``,
``updater``, ``learning_rate``, ``layer``) is a :class:`ComponentConf`: common fields here,
the selected component's own ``*_conf`` declared by the component itself.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, ClassVar

from .components import ComponentConf, layers, lr_methods, param_generators, updaters
from .errors import ParamError, Problem
from .parameter import Parameter, field
from .tree import Block


class ParamGenConf(ComponentConf):
    """How a Param's values are initialised (SPEC §4); SINGA's ``init { ... }``."""

    registry: ClassVar = param_generators
    type: str = field("kConstant", enum=param_generators, doc="Initialisation method.")
    user_type: str | None = field(None, enum=param_generators,
                                  doc="A user-registered initialisation method.")
    value: float = field(1.0, doc="Constant value (kConstant) or factor the fill is "
                                  "multiplied by (other methods).")
    mean: float = field(0.0, doc="Mean of the Gaussian methods.")
    std: float = field(1.0, lower=0.0, doc="Standard deviation of the Gaussian methods.")
    low: float = field(-1.0, doc="Lower bound of the uniform methods.")
    high: float = field(1.0, doc="Upper bound of the uniform methods.")

    def check(self) -> list[str]:
        if self.low > self.high:
            return [f"low ({self.low:g}) must not be greater than high ({self.high:g})"]
        return []


class ParamConf(Parameter):
    """One Param of a layer (SPEC §3); SINGA's ``param { ... }``."""

    name: str | None = field(None, doc="Unique name; generated as <layer>_<index> when absent.")
    init: ParamGenConf = field(factory=ParamGenConf, doc="Initialisation method.")
    share_from: str | None = field(None, doc="Name of the Param whose configuration and "
                                             "values this one shares.")
    lr_scale: float = field(1.0, lower=0.0, doc="Multiplied with the learning rate.")
    wd_scale: float = field(1.0, lower=0.0, doc="Multiplied with the weight decay.")


class LRGenConf(ComponentConf):
    """The learning-rate change method (SPEC §6); SINGA's ``learning_rate { ... }``."""

    registry: ClassVar = lr_methods
    type: str = field("kFixed", enum=lr_methods, doc="Learning-rate change method.")
    user_type: str | None = field(None, enum=lr_methods,
                                  doc="A user-registered learning-rate method.")
    base_lr: float = field(0.01, lower=0.0, doc="Base learning rate.")


class UpdaterConf(ComponentConf):
    """The updater every server applies (SPEC §5); SINGA's ``updater { ... }``."""

    registry: ClassVar = updaters
    type: str = field("kSGD", enum=updaters, doc="Update method.")
    user_type: str | None = field(None, enum=updaters, doc="A user-registered updater.")
    learning_rate: LRGenConf = field(factory=LRGenConf, doc="Learning-rate change method.")
    momentum: float = field(0.0, lower=0.0, upper=1.0, doc="Momentum.")
    weight_decay: float = field(0.0, lower=0.0, doc="Weight decay (L2) coefficient.")
    delta: float = field(1e-8, lower=0.0, lower_exclusive=True,
                         doc="Small constant that keeps divisions finite (epsilon).")
    clip_low: float = field(0.0, doc="Gradients are clamped into [clip_low, clip_high] "
                                     "when clip_high > clip_low.")
    clip_high: float = field(0.0, doc="See clip_low.")


class TrainOneBatchConf(Parameter):
    """The algorithm of one training step; SINGA's ``train_one_batch { alg: kBP }``."""

    alg: str = field("kBP", enum=("kBP",), doc="Back-propagation (the one algorithm run here).")


class LayerConf(ComponentConf):
    """One layer of the net; SINGA's ``layer { ... }``."""

    registry: ClassVar = layers
    name: str = field(doc="Unique name of the layer.")
    type: str | None = field(None, enum=layers, doc="Layer type (or give user_type).")
    user_type: str | None = field(None, enum=layers, doc="A user-registered layer type.")
    srclayers: list[str] = field(factory=list, doc="Names of the layers this one reads.")
    param: list[ParamConf] = field(factory=list, doc="The layer's Params, in order.")
    exclude: list[str] = field(factory=list, enum=("kTrain", "kTest", "kVal"),
                               doc="Phases in which this layer is left out.")

    def check(self) -> list[str]:
        if self.type is None and self.user_type is None:
            return [f"layer '{self.name}' needs a type (or a user_type); known types: "
                    f"{layers.choices()}"]
        return []


class NetConf(Parameter):
    """The neural net: its layers in order; SINGA's ``neuralnet { ... }``."""

    layer: list[LayerConf] = field(factory=list, doc="The layers.")
    partition_dim: int = field(0, lower=-1, upper=1, doc="Accepted for SINGA compatibility; "
                                                        "layers are not partitioned here.")

    def check(self) -> list[Problem]:
        problems, seen = [], set()
        for i, layer in enumerate(self.layer):
            if layer.name in seen:
                problems.append(Problem(f"layer name '{layer.name}' is used twice",
                                        f"layer[{i}].name"))
            seen.add(layer.name)
        for i, layer in enumerate(self.layer):
            for k, src in enumerate(layer.srclayers):
                if src not in seen:
                    earlier = [x.name for x in self.layer[:i]]  # what it may read
                    close = difflib.get_close_matches(src, earlier[::-1], n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    problems.append(Problem(f"layer '{layer.name}' reads unknown layer "
                                            f"'{src}'{hint}", f"layer[{i}].srclayers[{k}]"))
        return problems


class ClusterConf(Parameter):
    """Servers and workers (SPEC §7); SINGA's ``cluster { ... }``."""

    nworker_groups: int = field(1, lower=1, doc="Worker groups; asynchronous to each other.")
    nserver_groups: int = field(1, lower=1, doc="Server groups, each holding all Params.")
    nworkers_per_group: int = field(1, lower=1, doc="Workers in a group; synchronous (BSP).")
    nservers_per_group: int = field(1, lower=1, doc="Servers in a group; each holds slices.")
    nworkers_per_procs: int = field(1, lower=1, doc="Accepted for SINGA compatibility.")
    nservers_per_procs: int = field(1, lower=1, doc="Accepted for SINGA compatibility.")
    server_worker_separate: bool = field(False, doc="Run servers apart from workers.")
    sync_freq: int = field(1, lower=1, doc="Steps between synchronisations of server groups.")
    staleness: int | None = field(None, lower=0, doc="Bounded staleness: a worker may run at "
                                                     "most this many versions ahead.")
    workspace: str | None = field(None, doc="Folder for checkpoints and metrics (SINGA "
                                            "keeps it here; job.workspace wins).")
    backend: str = field("local", enum=("local", "ray"), doc="Where servers and workers run.")
    ray_address: str | None = field(None, doc="Address of an existing Ray cluster.")
    timeout: float = field(60.0, lower=0.0, lower_exclusive=True,
                           doc="Seconds any wait may take before it is an error.")
    on_worker_failure: str = field("stop", enum=("stop", "continue"),
                                   doc="Stop the job, or go on without a dead worker.")
    nonfinite: str = field("error", enum=("error", "skip"),
                           doc="A gradient with NaN or Inf: stop with an error, or skip it.")


class JobConf(Parameter):
    """A training job; SINGA's ``job.conf``."""

    name: str = field("job", doc="Name of the job.")
    train_steps: int = field(lower=0, doc="Number of training steps.")
    disp_freq: int = field(0, lower=0, doc="Steps between progress reports (0: default).")
    test_freq: int = field(0, lower=0, doc="Steps between tests (0: no tests during training).")
    test_steps: int = field(0, lower=0, doc="Batches per test (0: the whole test split).")
    test_after: int = field(0, lower=0, doc="First step at which tests may run.")
    valid_freq: int = field(0, lower=0, doc="Accepted for SINGA compatibility.")
    valid_steps: int = field(0, lower=0, doc="Accepted for SINGA compatibility.")
    checkpoint_freq: int = field(0, lower=0, doc="Steps between checkpoints (0: none).")
    checkpoint_after: int = field(0, lower=0, doc="First step at which checkpoints are written.")
    checkpoint_path: list[str] = field(factory=list, doc="Checkpoints to start from.")
    workspace: str | None = field(None, doc="Folder for checkpoints, metrics and plots.")
    seed: int = field(0, lower=0, doc="Seed of every random choice of the job (init, data "
                                      "order).")
    debug: bool = field(False, doc="Extra checks while training.")
    train_one_batch: TrainOneBatchConf = field(factory=TrainOneBatchConf,
                                               doc="Algorithm of one step.")
    neuralnet: NetConf = field(doc="The neural net.")
    updater: UpdaterConf = field(factory=UpdaterConf, doc="The updater.")
    cluster: ClusterConf = field(factory=ClusterConf, doc="Servers and workers.")

    @property
    def workspace_dir(self) -> str:
        return self.workspace or self.cluster.workspace or f"workspace/{self.name}"


def parse_job(text: str, filename: str = "<string>") -> JobConf:
    """Read a job from the text of a job file; errors name ``filename:line:column``."""
    from .textformat import parse_text

    block = parse_text(text, filename)
    return JobConf._build(block)


def load_job(path: str | Path) -> JobConf:
    """Read a job file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ParamError(f"{path}: cannot read the job file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ParamError(f"{path}: the job file is not UTF-8 text ({e.reason})") from None
    return parse_job(text, str(path))


def conf_from(cls: type[Any], x: Any, block_name: str) -> Any:
    """A configuration of ``cls`` from an instance, a nested dict, or the text of its block.

    The text may be the block's body (``type: kSGD momentum: 0.9``) or the whole block
    (``updater { type: kSGD }``).
    """
    if isinstance(x, cls):
        return x
    if isinstance(x, str):
        from .textformat import parse_text

        block = parse_text(x, f"<{block_name}>")
        if len(block.entries) == 1 and block.entries[0].key == block_name and isinstance(
                block.entries[0].value, Block):
            block = block.entries[0].value
        return cls._build(block)
    if isinstance(x, dict):
        return cls.parse(x)
    raise ParamError(f"expected a configuration ({cls.__name__}), a dict or the text of the "
                     f"{block_name} block, not {type(x).__name__}")


__all__ = ["ClusterConf", "JobConf", "LRGenConf", "LayerConf", "NetConf", "ParamConf",
           "ParamGenConf", "TrainOneBatchConf", "UpdaterConf", "conf_from", "load_job",
           "parse_job"]
