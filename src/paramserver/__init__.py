"""paramserver: the parameters of machine-learning training, after Apache SINGA and dmlc-core.

The public API is re-exported here and loaded on first use, so that ``import paramserver``
stays fast (numba, protobuf and the kernels load only when something needs them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Parameter": "paramserver.config",
    "field": "paramserver.config",
    "ParamError": "paramserver.config",
    "Registry": "paramserver.config",
    "Location": "paramserver.config",
}

if TYPE_CHECKING:
    from .config import Location, ParamError, Parameter, Registry, field


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'paramserver' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["Location", "ParamError", "Parameter", "Registry", "__version__", "field"]
