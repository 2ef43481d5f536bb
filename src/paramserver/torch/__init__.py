"""PyTorch models on paramserver: a module's parameters as Params, SINGA's updaters as a
``torch.optim.Optimizer``, and training with several workers on paramserver's cluster.

Needs PyTorch (``pip install paramserver[torch]``); ``import paramserver`` alone never
imports it. See ``docs/torch.md``.

- :func:`bind` puts a module's parameters into paramserver's flat memory (tensors view it),
  configured per parameter by name pattern;
- :class:`Optimizer` is a ``torch.optim.Optimizer`` that updates them with an updater, on
  the host, on their GPU, or offloaded (an fp32 master and the state in host memory);
- :class:`SGD`, :class:`Adam`, :class:`AdamW`, :class:`Adagrad`, :class:`RMSprop`,
  :class:`Adadelta`, :class:`Adamax`, :class:`NAdam`, :class:`RAdam`, :class:`SparseAdam`
  take torch.optim's arguments and defaults, compute what it computes, and keep (and load)
  its state_dict;
- :func:`train_on_cluster` trains replicas of a module with several workers.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (the real PyTorch: imports here are absolute)
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("paramserver.torch needs PyTorch: pip install 'paramserver[torch]'"
                      ) from e

from ._bind import TorchParams, bind, binding_of
from ._cluster import LossFn, TorchCluster, TorchJob, load_job, parse_job, train_on_cluster
from ._optim import Optimizer, Placement
from ._overlap import Overlap
from ._rules import ParamRule, parse_rules, rules_from_text
from ._torchstyle import (
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    Adamax,
    AdamW,
    NAdam,
    RAdam,
    RMSprop,
    SparseAdam,
)

__all__ = ["SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "LossFn", "NAdam",
           "Optimizer", "Overlap", "ParamRule", "Placement", "RAdam", "RMSprop", "SparseAdam",
           "TorchCluster", "TorchJob", "TorchParams", "bind", "binding_of", "load_job",
           "parse_job", "parse_rules", "rules_from_text", "train_on_cluster"]
