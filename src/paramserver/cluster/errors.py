"""The cluster's runtime failures: timeouts, dead workers and servers, non-finite gradients.

Configuration mistakes are :class:`paramserver.config.ParamError`, as everywhere else; both
are :class:`paramserver.Error`.
"""

from __future__ import annotations

from ..config.errors import Error


class ClusterError(Error, RuntimeError):
    """Training on the cluster failed; the message says where, at which step, and why.

    A failure caused by an exception (a worker's gradient function raising) chains it as
    ``__cause__``.
    """


class ServerLost(ClusterError):
    """A server was lost (its process died) while a request to it waited; a backend that
    restarts servers (Ray) brings it back, and the run goes back to its checkpoints."""

    def __init__(self, message: str, address: tuple[int, int]):
        super().__init__(message)
        self.address = address

    def __reduce__(self) -> tuple[type, tuple[str, tuple[int, int]]]:
        return type(self), (str(self), self.address)


__all__ = ["ClusterError", "ServerLost"]
