"""SINGA's enums as its ``job.proto`` and ``common.proto`` number them (v0.1.0 to v0.3.0).

A job file may give an enum value by name (``type: kSGD``) or, as protobuf's text format
allows, by number (``type: 1``). The tables here are the one place the numbers are written.
Where a later release renumbered an enum (``LayerType``: v0.1.0 counted from 1, v0.2.0 from
100), both numberings are accepted; the one number they both use, 102, means what v0.2.0
made it (``kPrefetch``; v0.1.0's ``kUserLayer`` is 600 since).

Enums that select a registered component (layer, updater, learning-rate method, init method)
number the component registries of :mod:`.components`; the others are :class:`ProtoEnum`
field types of the schema (``include: kTrain``, ``pool: MAX``).
"""

from __future__ import annotations

from collections.abc import Mapping

from .registry import Registry


class ProtoEnum(Registry[int]):
    """A SINGA enum used as the type of a field: ``field(..., enum=PHASE)``.

    Values are written by name (``kTrain``; the look-up ignores letter case, underscores and
    a leading ``k`` as for every registry) or by number (``1``). The field holds the
    canonical name.
    """

    def __init__(self, kind: str, values: Mapping[str, int],
                 aliases: Mapping[str, tuple[str, ...]] | None = None):
        super().__init__(kind)
        for name, number in values.items():
            self.add(name, number, aliases=(aliases or {}).get(name, ()))
        self.set_numbers({number: name for name, number in values.items()})

    def number(self, name: str) -> int:
        """The number of a value, by any accepted spelling."""
        return self.get(name)


# -- enums that select registered components -----------------------------------------------

#: ``LayerType`` of v0.2.0 and v0.3.0 (v0.2.0 alone had kPrefetch; v0.3.0 added kActivation,
#: kBM and kCudnnBM).
LAYER_TYPE: dict[str, int] = {
    "kCSVInput": 100, "kImagePreprocess": 101, "kPrefetch": 102, "kRecordInput": 103,
    "kLMDBData": 190, "kLabel": 191, "kMnist": 192, "kRGBImage": 193, "kShardData": 194,
    "kCharRNN": 195, "kRNNLabel": 196, "kOneHot": 197,
    "kConvolution": 201, "kCConvolution": 202, "kDropout": 203, "kDummy": 204,
    "kInnerProduct": 205, "kLRN": 206, "kPooling": 207, "kCPooling": 208, "kRBMHid": 209,
    "kRBMVis": 210, "kReLU": 211, "kSTanh": 212, "kSigmoid": 213, "kSoftmax": 214,
    "kGRU": 215, "kEmbedding": 216, "kActivation": 217, "kBM": 218,
    "kCudnnConv": 250, "kCudnnPool": 251, "kCudnnLRN": 252, "kCudnnSoftmax": 253,
    "kCudnnActivation": 254, "kCudnnBM": 255,
    "kEuclideanLoss": 300, "kSoftmaxLoss": 301, "kCudnnSoftmaxLoss": 350,
    "kAccuracy": 400, "kArgSort": 401, "kCSVOutput": 402, "kRecordOutput": 403,
    "kCharRNNOutput": 404,
    "kBridgeDst": 500, "kBridgeSrc": 501, "kConcate": 502, "kSlice": 503, "kSplit": 504,
    "kRNNDummy": 505,
    "kUserLayer": 600,
}
#: ``LayerType`` of v0.1.0, where it differs (its kUserLayer, 102, is kPrefetch since v0.2.0).
LAYER_TYPE_V010: dict[str, int] = {
    "kConvolution": 1, "kConcate": 2, "kShardData": 3, "kDropout": 4, "kInnerProduct": 5,
    "kLRN": 6, "kMnist": 7, "kPooling": 8, "kReLU": 9, "kRGBImage": 10, "kSoftmaxLoss": 11,
    "kSlice": 12, "kSplit": 13, "kSTanh": 14, "kBridgeSrc": 15, "kBridgeDst": 16,
    "kLMDBData": 17, "kLabel": 18, "kPrefetch": 19, "kRBMVis": 23, "kRBMHid": 24,
    "kEuclideanLoss": 25, "kSigmoid": 26, "kCConvolution": 27, "kCPooling": 28,
}
#: ``UpdaterType`` (kAdaDelta, kAdam and kAdamMax from v0.3.0).
UPDATER_TYPE: dict[str, int] = {
    "kSGD": 1, "kAdaGrad": 2, "kRMSProp": 3, "kNesterov": 4, "kAdaDelta": 5, "kAdam": 6,
    "kAdamMax": 7, "kUserUpdater": 105,
}
#: ``ChangeMethod``: the learning-rate methods.
CHANGE_METHOD: dict[str, int] = {
    "kFixed": 0, "kInverseT": 1, "kInverse": 2, "kExponential": 3, "kLinear": 4, "kStep": 5,
    "kFixedStep": 6, "kUserChange": 100,
}
#: ``InitMethod``: the initialisation methods (3 is not used).
INIT_METHOD: dict[str, int] = {
    "kConstant": 0, "kGaussian": 1, "kUniform": 2, "kGaussianSqrtFanIn": 4,
    "kUniformSqrtFanIn": 5, "kUniformSqrtFanInOut": 6, "kUserInit": 101,
}

# -- enums that are field types ------------------------------------------------------------

#: ``Phase``: what a net is built for (kTrain, kVal, kTest) and the flags SINGA's algorithms
#: pass to layers. ``include``/``exclude`` take any of them.
PHASE = ProtoEnum("phase", {
    "kUnknown": 0, "kTrain": 1, "kVal": 2, "kTest": 4, "kPositive": 8, "kNegative": 16,
    "kForward": 32, "kBackward": 64, "kLoss": 128, "kDeploy": 256, "kAggGrad": 512})
#: ``AlgType``: the algorithm of one training step. ``kContrastiveDivergence`` is the name
#: SINGA's documents (and its pre-release example rbm_job.conf) use for kCD.
ALG_TYPE = ProtoEnum("training algorithm", {"kBP": 1, "kCD": 2, "kBPTT": 3, "kUserAlg": 104},
                     aliases={"kCD": ("kContrastiveDivergence",)})
#: ``ParamType``: a built-in Param or a user's.
PARAM_TYPE = ProtoEnum("Param type", {"kParam": 0, "kUser": 103})
#: ``UnrollConnType``: how an unrolled RNN layer connects to its sources (kBPTT).
UNROLL_CONN_TYPE = ProtoEnum("unrolling connection", {
    "kUnrollOneToOne": 1, "kUnrollOneToAll": 2, "kUnrollFirstToLast": 3,
    "kUnrollCustomized": 4})
#: ``ActivationType`` of ``activation_conf``.
ACTIVATION_TYPE = ProtoEnum("activation", {"RELU": 1, "SIGMOID": 2, "TANH": 3, "STANH": 4})
#: ``PoolingProto.PoolMethod`` of ``pooling_conf``.
POOL_METHOD = ProtoEnum("pooling method", {"MAX": 0, "AVG": 1})

#: Enums of SINGA's files that no field of a job file takes, and why (``paramserver doc``
#: and docs/singa.md list them; tests check that every enum of the .proto files is here or
#: above).
UNUSED_ENUMS: dict[str, str] = {
    "PartitionType": "v0.1.0 declared it (kDataPartition, kLayerPartition, kNone) but no "
                     "field used it; partitioning is chosen by partition_dim",
    "MsgType": "messages between SINGA's processes (common.proto); servers and workers "
               "here exchange Python messages (or Ray's)",
    "EntityType": "addresses of SINGA's processes (common.proto)",
    "ConnectionType": "how SINGA connected layers across partitions (common.proto)",
    "Record.Type": "the kind of a Record in a data store (kSingleLabelImage = 0): written and "
                   "read by paramserver.singa.records",
}

__all__ = ["ACTIVATION_TYPE", "ALG_TYPE", "CHANGE_METHOD", "INIT_METHOD", "LAYER_TYPE",
           "LAYER_TYPE_V010", "PARAM_TYPE", "PHASE", "POOL_METHOD", "UNROLL_CONN_TYPE",
           "UNUSED_ENUMS", "UPDATER_TYPE", "ProtoEnum"]
