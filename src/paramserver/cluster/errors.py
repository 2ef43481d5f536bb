"""The cluster's runtime failures: timeouts, dead workers, non-finite gradients.

Configuration mistakes are :class:`paramserver.config.ParamError`, as everywhere else.
"""

from __future__ import annotations

from ..config.errors import Error


class ClusterError(Error, RuntimeError):
    """Training on the cluster failed; the message says where, at which step, and why.

    A failure caused by an exception (a worker's gradient function raising) chains it as
    ``__cause__``.
    """


__all__ = ["ClusterError"]
