"""SINGA's layer types (v0.1.0 to v0.3.0), each with the ``*_conf`` block it reads.

:data:`LAYER_TYPES` is the table: for every value of SINGA's ``LayerType`` enum, the
configuration block of the layer (:mod:`paramserver.singa.confs`), the releases that had it
and what it does. Importing this module (the layer registry does, after paramserver's own
layers) registers every type of the table that no module has built yet as a
:class:`UnbuiltLayer`: its configuration is read and checked like any other, ``paramserver
check`` lists it as not built yet and ``paramserver train`` refuses it with the same words.

A module that builds one of these types registers its class under the SINGA name with the
``Config`` given here (checked when this module is imported) before this module is loaded;
the name of its block (``convolution_conf`` for kCConvolution too) is taken from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..config import ParamError, Parameter
from ..config.components import layers
from ..config.singa_enums import LAYER_TYPE, LAYER_TYPE_V010
from ..train.layers import Layer
from . import confs as c


@dataclass(frozen=True)
class LayerType:
    """One of SINGA's layer types: its ``*_conf`` block, releases and purpose."""

    conf: type[Parameter] | None
    conf_name: str | None
    versions: str
    summary: str


def _t(conf: type[Parameter] | None, conf_name: str | None, versions: str,
       summary: str) -> LayerType:
    return LayerType(conf, conf_name, versions, summary)


ALL, V01, V02 = "v0.1.0-v0.3.0", "v0.1.0", "v0.2.0-v0.3.0"

#: Every layer type of SINGA's ``LayerType`` (except kUserLayer, which means "see user_type").
LAYER_TYPES: dict[str, LayerType] = {
    # input
    "kCSVInput": _t(c.StoreConf, "store_conf", V02, "Reads labelled samples from a textfile "
                    "(CSV) store."),
    "kImagePreprocess": _t(c.RGBImageConf, "rgbimage_conf", V02, "Crops, mirrors and scales "
                           "the images of its source."),
    "kPrefetch": _t(c.PrefetchConf, "prefetch_conf", "v0.1.0-v0.2.0", "Runs input layers "
                    "ahead of the net."),
    "kRecordInput": _t(c.StoreConf, "store_conf", V02, "Reads SingleLabelImageRecords from a "
                       "kvfile store."),
    "kLMDBData": _t(c.ShardConf, "lmdbdata_conf", ALL, "Reads Caffe datums from an LMDB "
                    "database."),
    "kLabel": _t(None, None, ALL, "The labels of its source's records."),
    "kMnist": _t(c.MnistConf, "mnist_conf", ALL, "Parses MNIST records into normalised "
                 "images."),
    "kRGBImage": _t(c.RGBImageConf, "rgbimage_conf", ALL, "Parses RGB image records (mean "
                    "file, crop, mirror, scale)."),
    "kShardData": _t(c.ShardConf, "sharddata_conf", ALL, "Reads Records from a DataShard "
                     "folder (v0.1.0's data format)."),
    "kCharRNN": _t(c.CharRNNConf, "char_rnn_conf", V02, "Reads a text file as character "
                   "ids for an unrolled RNN."),
    "kRNNLabel": _t(None, None, V02, "The next-character labels of kCharRNN."),
    "kOneHot": _t(c.OnehotConf, "onehot_conf", V02, "Ids to one-hot vectors."),
    # neuron
    "kConvolution": _t(c.ConvolutionConf, "convolution_conf", ALL, "2-D convolution."),
    "kCConvolution": _t(c.ConvolutionConf, "convolution_conf", ALL, "2-D convolution "
                        "(Caffe's im2col implementation)."),
    "kDropout": _t(c.DropoutConf, "dropout_conf", ALL, "Dropout."),
    "kDummy": _t(c.DummyConf, "dummy_conf", V02, "A stand-in layer for tests."),
    "kInnerProduct": _t(c.InnerProductConf, "innerproduct_conf", ALL, "Fully connected."),
    "kLRN": _t(c.LRNConf, "lrn_conf", ALL, "Local response normalisation."),
    "kPooling": _t(c.PoolingConf, "pooling_conf", ALL, "Max or average pooling."),
    "kCPooling": _t(c.PoolingConf, "pooling_conf", ALL, "Pooling (Caffe's implementation)."),
    "kRBMHid": _t(c.RBMConf, "rbm_conf", ALL, "Hidden layer of an RBM (kCD)."),
    "kRBMVis": _t(c.RBMConf, "rbm_conf", ALL, "Visible layer of an RBM (kCD)."),
    "kReLU": _t(c.ReLUConf, "relu_conf", ALL, "max(x, 0)."),
    "kSTanh": _t(None, None, ALL, "Scaled tanh."),
    "kSigmoid": _t(None, None, ALL, "Logistic sigmoid."),
    "kSoftmax": _t(c.SoftmaxConf, "softmax_conf", V02, "Softmax."),
    "kGRU": _t(c.GRUConf, "gru_conf", V02, "Gated recurrent unit (kBPTT)."),
    "kEmbedding": _t(c.EmbeddingConf, "embedding_conf", V02, "Rows of a table by id."),
    "kActivation": _t(c.ActivationConf, "activation_conf", "v0.3.0", "An activation chosen "
                      "by activation_conf."),
    "kBM": _t(c.BMConf, "bm_conf", "v0.3.0", "Batch normalisation."),
    "kCudnnConv": _t(c.ConvolutionConf, "convolution_conf", V02, "Convolution (cuDNN)."),
    "kCudnnPool": _t(c.PoolingConf, "pooling_conf", V02, "Pooling (cuDNN)."),
    "kCudnnLRN": _t(c.LRNConf, "lrn_conf", V02, "Local response normalisation (cuDNN)."),
    "kCudnnSoftmax": _t(c.SoftmaxConf, "softmax_conf", V02, "Softmax (cuDNN)."),
    "kCudnnActivation": _t(c.ActivationConf, "activation_conf", V02, "Activation (cuDNN)."),
    "kCudnnBM": _t(c.BMConf, "bm_conf", "v0.3.0", "Batch normalisation (cuDNN)."),
    # loss
    "kEuclideanLoss": _t(c.EuclideanLossConf, "euclideanloss_conf", ALL, "Squared "
                         "Euclidean distance loss."),
    "kSoftmaxLoss": _t(c.SoftmaxLossConf, "softmaxloss_conf", ALL, "Softmax cross-entropy "
                       "loss and top-k accuracy."),
    "kCudnnSoftmaxLoss": _t(c.SoftmaxLossConf, "softmaxloss_conf", V02, "Softmax "
                            "cross-entropy loss (cuDNN)."),
    # output
    "kAccuracy": _t(c.ArgSortConf, "argsort_conf", V02, "Top-k accuracy of its source."),
    "kArgSort": _t(c.ArgSortConf, "argsort_conf", V02, "Ids of the top-k scores."),
    "kCSVOutput": _t(c.StoreConf, "store_conf", V02, "Writes its source's data to a textfile "
                     "(CSV) store."),
    "kRecordOutput": _t(c.StoreConf, "store_conf", V02, "Writes its source's data as records "
                        "to a store."),
    "kCharRNNOutput": _t(c.CharRNNConf, "char_rnn_conf", V02, "Writes sampled characters."),
    # connection
    "kBridgeDst": _t(None, None, ALL, "Receives data from another worker (partitioned "
                     "nets)."),
    "kBridgeSrc": _t(None, None, ALL, "Sends data to another worker (partitioned nets)."),
    "kConcate": _t(c.ConcateConf, "concate_conf", ALL, "Joins its sources along an axis."),
    "kSlice": _t(c.SliceConf, "slice_conf", ALL, "Cuts its source along an axis."),
    "kSplit": _t(c.SplitConf, "split_conf", ALL, "Copies its source to several layers."),
    "kRNNDummy": _t(c.RNNDummyConf, "rnn_dummy_conf", V02, "Input of an unrolled RNN when "
                    "sampling."),
}


class UnbuiltLayer(Layer):
    """A SINGA layer type that paramserver does not compute yet; its configuration is read
    and checked. ``paramserver check`` lists it, building a net with it is refused."""

    built: ClassVar[bool] = False

    def setup(self) -> None:
        raise self.error("is not built yet in paramserver")


def _register_unbuilt() -> None:
    problems = []
    for name, spec in LAYER_TYPES.items():
        if name in layers:
            cls: Any = layers.get(name)
            if getattr(cls, "Config", None) is not spec.conf:
                problems.append(f"{cls.__qualname__} builds {name} with Config "
                                f"{getattr(cls, 'Config', None)}; SINGA's is {spec.conf}")
            elif spec.conf_name is not None and "conf_name" not in vars(cls):
                cls.conf_name = spec.conf_name  # the table is the one home of the names
            elif spec.conf_name is not None and layers.conf_name(name) != spec.conf_name:
                problems.append(f"{cls.__qualname__} reads {layers.conf_name(name)}; SINGA's "
                                f"{name} reads {spec.conf_name}")
            continue
        doc = (f"{spec.summary} SINGA {spec.versions}; not built yet in paramserver: "
               "paramserver check lists it and paramserver train refuses it.")
        attrs = {"Config": spec.conf, "conf_name": spec.conf_name, "__doc__": doc,
                 "__module__": __name__, "__qualname__": f"{name[1:]}Layer"}
        layers.add(name, type(f"{name[1:]}Layer", (UnbuiltLayer,), attrs))
    if problems:
        raise ParamError("; ".join(problems))


_register_unbuilt()

assert set(LAYER_TYPES) | {"kUserLayer"} == set(LAYER_TYPE) | set(LAYER_TYPE_V010)

__all__ = ["LAYER_TYPES", "LayerType", "UnbuiltLayer"]
