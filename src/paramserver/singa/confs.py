"""The layer configurations of SINGA's ``job.proto``: every ``*_conf`` block, declared once.

Each class is one message of SINGA's ``LayerProto`` (``ConvolutionProto`` is
:class:`ConvolutionConf`), with every field any of v0.1.0, v0.2.0 and v0.3.0 declared and
SINGA's defaults. Where the releases differ the union is declared: a field that one release
required and a later one made optional is optional; where a default changed, the latest
release's is kept and the field's documentation says what the earlier one was. A field
that SINGA required in every release (``innerproduct_conf { num_output }``) is required
here.

These classes are the ``Config`` of the layers (:mod:`paramserver.singa.layers` maps every
layer type to its block); this module imports only the configuration layer.
"""

from __future__ import annotations

from ..config import Parameter, field
from ..config.job import LayerConf
from ..config.singa_enums import ACTIVATION_TYPE, POOL_METHOD

# -- input layers ----------------------------------------------------------------------------


class StoreConf(Parameter):
    """``store_conf`` (v0.2.0+): where a store input or output layer reads or writes records.

    Read by kRecordInput, kCSVInput (input) and kRecordOutput, kCSVOutput (output).
    """

    backend: str | None = field(None, doc="The store: 'kvfile' (binary key-value file) or "
                                           "'textfile' (one record per line, CSV). Output "
                                           "layers default to 'textfile'.")
    path: str | None = field(None, path=True,
                             doc="The store's file (for kvfile also a folder holding "
                                 "shard.dat), relative to the working folder.")
    separator: str = field(",", doc="Separator of the values of a textfile record.")
    mean_file: str | None = field(None, path=True, doc="A store whose first record is the mean "
                                                       "subtracted from every sample.")
    std_file: str | None = field(None, path=True, doc="A store whose first record divides every "
                                                      "sample (after the mean).")
    mean_value: float | None = field(None, finite=True, doc="One mean for every feature "
                                                            "(when no mean_file is given).")
    std_value: float | None = field(None, lower=0.0, lower_exclusive=True, finite=True,
                                    doc="One divisor for every feature (when no std_file is "
                                        "given).")
    batchsize: list[int] = field(factory=list, lower=1,
                                 doc="Samples per step: one value, split among the "
                                     "partitions of a layer; or one value per partition. "
                                     "(v0.2.0 declared a single value, default 1.)")
    shape: list[int] = field(factory=list, lower=1, doc="The shape of one sample's "
                                                         "features.")
    encoded: bool = field(False, doc="The pixels are an encoded image (JPEG) rather than "
                                     "raw bytes.")
    random_skip: int = field(0, lower=0, doc="Skip a random number of records in [0, "
                                             "random_skip] before the first batch.")
    has_label: bool = field(True, doc="Each textfile record starts with its label.")
    prefetching: bool = field(False, doc="Read the next batch while the current one is "
                                         "used (v0.3.0); no effect on the values read.")

    def check(self) -> list[str]:
        if not self.separator:
            return ["separator must not be empty (a textfile record's values are split "
                    "at it)"]
        return []


class ShardConf(Parameter):
    """SINGA's ``DataProto``: ``sharddata_conf`` (kShardData, v0.1.0's DataShard) and
    ``lmdbdata_conf`` (kLMDBData)."""

    path: str = field(path=True,
                      doc="The shard folder (holding shard.dat) or LMDB folder, relative to "
                          "the working folder.")
    batchsize: int = field(lower=1, doc="Records per step.")
    random_skip: int = field(0, lower=0, doc="Skip a random number of records in [0, "
                                             "random_skip] before the first batch.")


class MnistConf(Parameter):
    """``mnist_conf`` of kMnist: parses a record's pixels into a normalised 2-D image."""

    norm_a: float = field(1.0, lower=0.0, lower_exclusive=True, finite=True,
                          doc="Pixels are divided by norm_a ...")
    norm_b: float = field(0.0, finite=True, doc="... and then norm_b is subtracted.")
    kernel: int = field(0, lower=0, doc="Elastic distortion: Gaussian kernel size.")
    sigma: float = field(0.0, lower=0.0, finite=True,
                         doc="Elastic distortion: Gaussian sigma.")
    alpha: float = field(0.0, finite=True, doc="Elastic distortion: scale of the "
                                               "displacement.")
    beta: float = field(0.0, finite=True, doc="Rotation or horizontal shearing.")
    gamma: float = field(0.0, finite=True, doc="Scaling.")
    resize: int = field(0, lower=0, doc="Scale images to this size before distortion.")
    elastic_freq: int = field(0, lower=0, doc="Distort every elastic_freq steps.")


class RGBImageConf(Parameter):
    """``rgbimage_conf`` of kRGBImage and kImagePreprocess: parses and augments RGB images."""

    scale: float = field(1.0, lower=0.0, finite=True,
                         doc="Every pixel is multiplied by it (after the mean).")
    cropsize: int = field(0, lower=0, doc="Crop a random cropsize x cropsize square in "
                                          "training (the centre in tests); 0: no crop.")
    mirror: bool = field(False, doc="Mirror images at random in training.")
    meanfile: str = field("", path=True,
                          doc="The mean image subtracted from every image: a serialized "
                              "record (v0.1.0's image_mean.bin) or a Caffe "
                              ".binaryproto.")


class CharRNNConf(Parameter):
    """``char_rnn_conf`` of kCharRNN (input) and kCharRNNOutput (sampling output)."""

    path: str | None = field(None, path=True, doc="The text file to read.")
    vocab_path: str | None = field(None, path=True,
                                   doc="The file of the vocabulary: its characters in "
                                       "id order.")
    unroll_len: int = field(50, lower=1, doc="Characters per instance; should equal the "
                                             "net's unroll_len.")
    batchsize: int = field(1, lower=1, doc="Instances per step.")


class OnehotConf(Parameter):
    """``onehot_conf`` of kOneHot."""

    vocab_size: int = field(0, lower=0, doc="Length of the one-hot vectors (ids are in "
                                            "[0, vocab_size)).")


class PrefetchConf(Parameter):
    """``prefetch_conf`` of kPrefetch (v0.1.0, v0.2.0): the input layers it runs ahead."""

    sublayers: list[LayerConf] = field(factory=list, doc="The data and parser layers whose "
                                                         "records are read ahead.")


# -- neuron layers ---------------------------------------------------------------------------


class ActivationConf(Parameter):
    """``activation_conf`` of kActivation and kCudnnActivation."""

    type: str = field("RELU", enum=ACTIVATION_TYPE, doc="The function: RELU, SIGMOID, TANH "
                                                        "or STANH.")


class ConvolutionConf(Parameter):
    """``convolution_conf`` of kConvolution, kCConvolution and kCudnnConv."""

    num_filters: int = field(0, lower=0, doc="Output channels (v0.1.0 required it; 0 "
                                             "cannot be built).")
    kernel: int = field(3, lower=1, doc="Square kernel size (v0.1.0 required it); "
                                        "kernel_x/kernel_y give other shapes.")
    pad: int = field(0, lower=0, doc="Zero padding on every side.")
    stride: int = field(1, lower=1, doc="Stride.")
    kernel_x: int = field(3, lower=1, doc="Kernel width, when kernel is not given.")
    kernel_y: int = field(3, lower=1, doc="Kernel height, when kernel is not given.")
    pad_x: int = field(0, lower=0, doc="Padding left and right, when pad is not given.")
    pad_y: int = field(0, lower=0, doc="Padding top and bottom, when pad is not given.")
    stride_x: int = field(1, lower=1, doc="Horizontal stride, when stride is not given.")
    stride_y: int = field(1, lower=1, doc="Vertical stride, when stride is not given.")
    workspace_byte_limit: int = field(512, lower=0, doc="cuDNN's workspace in MB; no "
                                                        "effect on the result.")
    bias_term: bool = field(True, doc="Add a bias per filter (v0.1.0; later releases "
                                      "always do).")


class DropoutConf(Parameter):
    """``dropout_conf`` of kDropout."""

    dropout_ratio: float = field(0.5, lower=0.0, upper=1.0,
                                 doc="Probability that an element is dropped, below 1.")

    def check(self) -> list[str]:
        if not self.dropout_ratio < 1.0:
            return [f"dropout_ratio must be below 1, got {self.dropout_ratio:g}"]
        return []


class DummyConf(Parameter):
    """``dummy_conf`` of kDummy, a layer for tests."""

    input: bool = field(False, doc="Act as an input layer (random data of shape).")
    output: bool = field(False, doc="Act as an output layer.")
    shape: list[int] = field(factory=list, lower=1, doc="Shape of its data.")


class InnerProductConf(Parameter):
    """``innerproduct_conf`` of kInnerProduct."""

    num_output: int = field(lower=1, doc="Number of outputs (hidden units).")
    bias_term: bool = field(True, doc="Add a bias vector, the layer's second Param.")
    transpose: bool = field(False, doc="Store the weight as (num_input, num_output) instead "
                                       "of (num_output, num_input).")


class LRNConf(Parameter):
    """``lrn_conf`` of kLRN and kCudnnLRN: local response normalisation across channels."""

    local_size: int = field(5, lower=1, doc="Channels summed over (odd, as SINGA requires).")
    alpha: float = field(1.0, lower=0.0, finite=True, doc="Scale of the sum of squares.")
    beta: float = field(0.75, finite=True, doc="Exponent.")
    knorm: float = field(1.0, lower=0.0, lower_exclusive=True, finite=True,
                         doc="Offset added before the exponent; above 0, so that the base "
                             "of the power is never 0.")

    def check(self) -> list[str]:
        if self.local_size % 2 != 1:
            return [f"local_size must be odd (the window is centred on the channel), got "
                    f"{self.local_size}"]
        return []


class PoolingConf(Parameter):
    """``pooling_conf`` of kPooling, kCPooling and kCudnnPool."""

    kernel: int = field(3, lower=1, doc="Square window size (v0.1.0 required it).")
    pool: str = field("MAX", enum=POOL_METHOD, doc="MAX or AVG.")
    pad: int = field(0, lower=0, doc="Zero padding on every side.")
    stride: int = field(2, lower=1, doc="Stride (v0.1.0's default was 1).")
    kernel_x: int = field(3, lower=1, doc="Window width, when kernel is not given.")
    kernel_y: int = field(3, lower=1, doc="Window height, when kernel is not given.")
    pad_x: int = field(0, lower=0, doc="Padding left and right, when pad is not given.")
    pad_y: int = field(0, lower=0, doc="Padding top and bottom, when pad is not given.")
    stride_x: int = field(2, lower=1, doc="Horizontal stride, when stride is not given.")
    stride_y: int = field(2, lower=1, doc="Vertical stride, when stride is not given.")


class RBMConf(Parameter):
    """``rbm_conf`` of kRBMVis and kRBMHid."""

    hdim: int = field(lower=1, doc="Number of hidden units.")
    bias_term: bool = field(True, doc="Use bias vectors.")
    gaussian: bool = field(False, doc="Gaussian hidden units (else binary, sampled).")


class ReLUConf(Parameter):
    """``relu_conf`` of kReLU."""

    negative_slope: float = field(0.0, finite=True,
                                  doc="Slope for negative inputs. No effect, as in SINGA, "
                                      "whose ReLU layers never read it.")


class SoftmaxConf(Parameter):
    """``softmax_conf`` of kSoftmax and kCudnnSoftmax."""

    num_softmax_per_instance: int = field(1, lower=1, doc="Softmax over this many groups of "
                                                          "each sample's features (e.g. one "
                                                          "per channel).")


class GRUConf(Parameter):
    """``gru_conf`` of kGRU."""

    dim_hidden: int = field(lower=1, doc="Size of the hidden state.")
    bias_term: bool = field(True, doc="Use bias vectors.")


class EmbeddingConf(Parameter):
    """``embedding_conf`` of kEmbedding."""

    vocab_size: int = field(0, lower=0, doc="Number of ids; inputs are in [0, vocab_size). "
                                            "Must be set (0 cannot be built).")
    feature_dim: int = field(100, lower=1, doc="Length of each id's vector.")


class BMConf(Parameter):
    """``bm_conf`` of kBM and kCudnnBM (batch normalisation, v0.3.0): no fields."""


# -- loss and output layers ------------------------------------------------------------------


class EuclideanLossConf(Parameter):
    """``euclideanloss_conf`` of kEuclideanLoss (v0.1.0): no fields."""


class SoftmaxLossConf(Parameter):
    """``softmaxloss_conf`` of kSoftmaxLoss and kCudnnSoftmaxLoss."""

    topk: int = field(1, lower=1, doc="A sample counts as correct when its label is among "
                                      "the topk highest scores.")
    scale: float = field(1.0, lower=0.0, finite=True,
                         doc="The loss and its gradient are multiplied by it.")


class ArgSortConf(Parameter):
    """``argsort_conf`` of kArgSort and kAccuracy."""

    topk: int = field(1, lower=1, doc="Keep the ids of the topk highest scores.")


# -- connection layers -----------------------------------------------------------------------


class ConcateConf(Parameter):
    """``concate_conf`` of kConcate."""

    concate_dim: int = field(0, lower=0, doc="Axis the sources are joined on (v0.1.0 "
                                             "required it).")
    num_concates: int = field(1, lower=1, doc="Number of sources.")


class SliceConf(Parameter):
    """``slice_conf`` of kSlice."""

    slice_dim: int = field(0, lower=0, doc="Axis the source is cut on (v0.1.0 required "
                                           "it).")
    num_slices: int = field(1, lower=1, doc="Number of pieces.")


class SplitConf(Parameter):
    """``split_conf`` of kSplit."""

    num_splits: int = field(1, lower=1, doc="Number of copies of the source.")


class RNNDummyConf(Parameter):
    """``rnn_dummy_conf`` of kRNNDummy: the input of an unrolled RNN when sampling."""

    dynamic_srclayer: str | None = field(None, doc="The layer whose output feeds the next "
                                                   "unrolled step.")
    shape: list[int] = field(factory=list, lower=1, doc="Shape of the random data of the "
                                                         "first step.")
    integer: bool = field(False, doc="Generate integers.")
    low: float = field(0.0, finite=True, doc="Lower bound of the random values.")
    high: float = field(0.0, finite=True, doc="Upper bound of the random values.")

    def check(self) -> list[str]:
        if self.low > self.high:
            return [f"low must not exceed high, got low {self.low:g} and high {self.high:g}"]
        return []


__all__ = ["ActivationConf", "ArgSortConf", "BMConf", "CharRNNConf", "ConcateConf",
           "ConvolutionConf", "DropoutConf", "DummyConf", "EmbeddingConf", "EuclideanLossConf",
           "GRUConf", "InnerProductConf", "LRNConf", "MnistConf", "OnehotConf", "PoolingConf",
           "PrefetchConf", "RBMConf", "RGBImageConf", "RNNDummyConf", "ReLUConf",
           "ShardConf", "SliceConf", "SoftmaxConf", "SoftmaxLossConf", "SplitConf",
           "StoreConf"]
