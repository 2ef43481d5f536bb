"""paramserver: the parameters of machine-learning training, after Apache SINGA and dmlc-core.

The public API is re-exported here and loaded on first use, so that ``import paramserver``
stays fast (numba, protobuf and the kernels load only when something needs them).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._version import __version__

_EXPORTS: dict[str, str] = {
    "Error": "paramserver.config",
    "Parameter": "paramserver.config",
    "field": "paramserver.config",
    "ParamError": "paramserver.config",
    "Registry": "paramserver.config",
    "Location": "paramserver.config",
    "JobConf": "paramserver.config.job",
    "load_job": "paramserver.config.job",
    "parse_job": "paramserver.config.job",
    "Param": "paramserver.params",
    "ParamSet": "paramserver.params",
    "ParamGenerator": "paramserver.init",
    "create_param_generator": "paramserver.init",
    "init_params": "paramserver.init",
    "register_param_generator": "paramserver.init",
    "LRMethod": "paramserver.schedules",
    "create_lr_method": "paramserver.schedules",
    "register_lr_method": "paramserver.schedules",
    "Updater": "paramserver.updaters",
    "create_updater": "paramserver.updaters",
    "register_updater": "paramserver.updaters",
    "Cluster": "paramserver.cluster",
    "ClusterError": "paramserver.cluster",
    "save_checkpoint": "paramserver.checkpoint",
    "CheckpointError": "paramserver.checkpoint",
    "load_checkpoint": "paramserver.checkpoint",
}

if _typing.TYPE_CHECKING:
    from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from .cluster import Cluster, ClusterError
    from .config import Error, Location, ParamError, Parameter, Registry, field
    from .config.job import JobConf, load_job, parse_job
    from .init import (
        ParamGenerator,
        create_param_generator,
        init_params,
        register_param_generator,
    )
    from .params import Param, ParamSet
    from .schedules import LRMethod, create_lr_method, register_lr_method
    from .updaters import Updater, create_updater, register_updater


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'paramserver' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API (what ``__all__`` lists) and the subpackages loaded so far; not the
    helpers of this module."""
    loaded = {k for k, v in globals().items()
              if type(v) is type(_typing) and not k.startswith("_")}
    return sorted({*__all__, *loaded})


__all__ = [
    "CheckpointError",
    "Cluster",
    "ClusterError",
    "Error",
    "JobConf",
    "LRMethod",
    "Location",
    "Param",
    "ParamError",
    "ParamGenerator",
    "ParamSet",
    "Parameter",
    "Registry",
    "Updater",
    "__version__",
    "create_lr_method",
    "create_param_generator",
    "create_updater",
    "field",
    "init_params",
    "load_checkpoint",
    "load_job",
    "parse_job",
    "register_lr_method",
    "register_param_generator",
    "register_updater",
    "save_checkpoint",
]
