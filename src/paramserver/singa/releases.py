"""Which of SINGA's releases a job file is written for: what its checkpoints and log lines
follow.

SINGA v0.1.0 and v0.2.0 differ where a user sees it:

* the names in checkpoints (``step<N>-worker<M>``): v0.1.0 writes a Param by its name
  (``w1``); v0.2.0 and v0.3.0 unroll every net (``NeuralNet::Unrolling``) and name the Params
  of copy ``i`` of a layer ``i#<name>``, the owners being copy 0's (``0#w1``);
* the log lines of training, tests and validations (:mod:`paramserver.singa.logs`).

A job file does not say its release. Its data layers do: v0.1.0 read its data through
``kShardData`` (a DataShard folder), which v0.2.0 kept only as deprecated (its examples read
stores: ``kRecordInput``, ``kCSVInput``, ...). A job is of **v0.1.0** when it has a
``kShardData`` layer and no layer type that v0.1.0 did not have; every other job — v0.2.0's
and v0.3.0's files, and paramserver's own — is of **v0.2.0** (v0.3.0 writes and logs as
v0.2.0 does).
"""

from __future__ import annotations

from ..config.job import JobConf

#: The releases whose checkpoints and log lines differ.
V010, V020 = "v0.1.0", "v0.2.0"
RELEASES = (V010, V020)


def job_release(job: JobConf) -> str:
    """The release a job file is written for: :data:`V010` or :data:`V020` (see the module
    docstring)."""
    from .layers import LAYER_TYPES, V01

    types = {layer.type for layer in job.neuralnet.layer if layer.type}
    if "kShardData" not in types:
        return V020
    later = {t for t in types if t in LAYER_TYPES and not LAYER_TYPES[t].versions.startswith(V01)}
    return V020 if later else V010


__all__ = ["RELEASES", "V010", "V020", "job_release"]
