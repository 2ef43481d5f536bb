"""The layers of the net, registered under SINGA's names; one module per family.

Importing this package registers every built-in layer (without importing PyTorch: set-up
needs no PyTorch, so that ``paramserver check`` runs without it; the computation does).
:mod:`.base` holds the interface (:class:`Layer`), the families are :mod:`.dense`,
:mod:`.conv`, :mod:`.loss`, :mod:`.input`, :mod:`.connection`, :mod:`.rbm` and :mod:`.rnn`.
"""

from .base import (
    TORCH_MISSING,
    Layer,
    LossLayer,
    phase_name,
    register_layer,
    require_torch,
)
from .connection import (
    BridgeDstLayer,
    BridgeSrcLayer,
    ConcateLayer,
    DummyLayer,
    SliceLayer,
    SlicePart,
    SplitLayer,
)
from .conv import (
    CConvolutionLayer,
    ConvolutionLayer,
    CPoolingLayer,
    CudnnConvLayer,
    CudnnLRNLayer,
    CudnnPoolLayer,
    LRNLayer,
    PoolingLayer,
)
from .dense import (
    ActivationLayer,
    ChosenActivationLayer,
    CudnnActivationLayer,
    CudnnSoftmaxLayer,
    DropoutLayer,
    EmbeddingLayer,
    InnerProductLayer,
    ReLULayer,
    SigmoidLayer,
    SoftmaxLayer,
    STanhLayer,
    TanhLayer,
)
from .input import (
    CharRNNLayer,
    CSVInputLayer,
    DataConf,
    DataLayer,
    ImagePreprocessLayer,
    InputLayer,
    LabelLayer,
    MnistLayer,
    OneHotLayer,
    RecordInputLayer,
    RGBImageLayer,
    RNNDummyLayer,
    RNNLabelLayer,
    ShardDataLayer,
    StoreInputLayer,
)
from .rbm import RBMHidLayer, RBMLayer, RBMVisLayer
from .rnn import CharRNNOutputLayer, GRULayer
from .loss import (
    AccuracyLayer,
    ArgSortLayer,
    CSVOutputLayer,
    CudnnSoftmaxLossLayer,
    EuclideanLossLayer,
    RecordOutputLayer,
    SoftmaxLossLayer,
)

__all__ = ["TORCH_MISSING", "AccuracyLayer", "ActivationLayer", "ArgSortLayer",
           "BridgeDstLayer", "BridgeSrcLayer", "CConvolutionLayer", "CPoolingLayer",
           "CSVInputLayer", "CSVOutputLayer", "CharRNNLayer", "CharRNNOutputLayer", "ChosenActivationLayer",
           "ConcateLayer", "ConvolutionLayer", "CudnnActivationLayer", "CudnnConvLayer",
           "CudnnLRNLayer", "CudnnPoolLayer", "CudnnSoftmaxLayer", "CudnnSoftmaxLossLayer",
           "DataConf", "DataLayer", "DropoutLayer", "DummyLayer", "EmbeddingLayer",
           "EuclideanLossLayer", "GRULayer", "ImagePreprocessLayer", "InnerProductLayer", "InputLayer",
           "LRNLayer", "LabelLayer", "Layer", "LossLayer", "MnistLayer", "OneHotLayer",
           "PoolingLayer", "RBMHidLayer", "RBMLayer", "RBMVisLayer", "RGBImageLayer", "RNNDummyLayer", "RNNLabelLayer",
           "RecordInputLayer", "RecordOutputLayer", "ReLULayer", "STanhLayer",
           "ShardDataLayer", "SigmoidLayer", "SliceLayer", "SlicePart", "SoftmaxLayer",
           "SoftmaxLossLayer", "SplitLayer", "StoreInputLayer", "TanhLayer", "phase_name",
           "register_layer", "require_torch"]
