"""The job schema: what a SINGA job file (``job.conf``) holds, as declarations.

Every message and field of SINGA's ``job.proto`` of v0.1.0, v0.2.0 and v0.3.0 (their union)
is declared, with SINGA's names, defaults and nesting, so that a SINGA user's file reads as
written; where we differ the SPEC says why. Each field's documentation says what it does
here, or that it is accepted with no effect and why (``paramserver doc FIELD``).

Each component block (``init``, ``updater``, ``learning_rate``, ``layer``) is a
:class:`ComponentConf`: common fields here, the selected component's own ``*_conf`` declared
by the component itself (the layers' in :mod:`paramserver.singa.confs`).
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import Any, ClassVar

from .components import ComponentConf, layers, lr_methods, param_generators, updaters
from .errors import ParamError, Problem
from .parameter import Parameter, field
from .singa_enums import ALG_TYPE, PARAM_TYPE, PHASE, UNROLL_CONN_TYPE
from .tree import Block, Scalar

#: How an updater may keep its per-element state (paramserver.quant).
STATE_DTYPES = ("float32", "bfloat16", "int8")
#: What the values workers read may be (a bfloat16 one keeps a float32 master copy).
VALUE_DTYPES = ("float32", "bfloat16")

#: The phases a net is built for (SINGA's NeuralNet::Create): training, validation, test.
NET_PHASES = ("kTrain", "kVal", "kTest")


class ParamGenConf(ComponentConf):
    """How a Param's values are initialised (SPEC §4); SINGA's ``init { ... }``."""

    registry: ClassVar = param_generators
    type: str = field("kConstant", enum=param_generators, doc="Initialisation method.")
    user_type: str | None = field(None, enum=param_generators,
                                  doc="A user-registered initialisation method.")
    value: float = field(1.0, finite=True, doc="Constant value (kConstant) or factor the "
                                               "fill is multiplied by (other methods).")
    mean: float = field(0.0, finite=True, doc="Mean of the Gaussian methods.")
    std: float = field(1.0, lower=0.0, finite=True,
                       doc="Standard deviation of the Gaussian methods.")
    low: float = field(-1.0, finite=True, doc="Lower bound of the uniform methods.")
    high: float = field(1.0, finite=True, doc="Upper bound of the uniform methods.")

    def check(self) -> list[str]:
        if self.low > self.high:
            return [f"low ({self.low:g}) must not be greater than high ({self.high:g})"]
        return []


class ParamConf(Parameter):
    """One Param of a layer (SPEC §3); SINGA's ``param { ... }``."""

    name: str | None = field(None, doc="Unique name; generated as <layer>_<index> when absent "
                                       "(SINGA's default, the empty name, is treated so).")
    type: str = field("kParam", enum=PARAM_TYPE,
                      doc="kParam (SINGA's built-in Param, the only kind here) or kUser (a "
                          "user's Param subclass: refused, paramserver has no such classes).")
    user_type: str | None = field(None, doc="The user's Param class of type kUser (refused, "
                                            "see type).")
    init: ParamGenConf = field(factory=ParamGenConf, doc="Initialisation method.")
    share_from: str | None = field(None, doc="Name of the Param whose configuration and "
                                             "values this one shares.")
    lr_scale: float = field(1.0, lower=0.0, finite=True,
                            doc="Multiplied with the learning rate.")
    wd_scale: float = field(1.0, lower=0.0, finite=True, doc="Multiplied with the weight decay.")
    id: int | None = field(None, doc="Set internally by SINGA; no effect.")
    owner: int = field(-1, doc="Set internally by SINGA; no effect.")
    partition_dim: int | None = field(None, doc="Set internally by SINGA for partitioned "
                                                "layers; no effect (servers slice Params by "
                                                "SPEC §7, whatever the layers do).")
    shape: list[int] = field(factory=list, lower=0,
                             doc="The Param's shape, which the layer infers; when given it "
                                 "must equal the inferred one (a check).")

    def check(self) -> list[str]:
        if self.type == "kUser" or self.user_type is not None:
            return [f"Param '{self.name or ''}': user Param types (type: kUser, user_type "
                    f"{self.user_type!r}) are not supported: every Param is paramserver's; "
                    "configure it with init, lr_scale, wd_scale and share_from"]
        return []


class LRGenConf(ComponentConf):
    """The learning-rate change method (SPEC §6); SINGA's ``learning_rate { ... }``."""

    registry: ClassVar = lr_methods
    type: str = field("kFixed", enum=lr_methods, doc="Learning-rate change method.")
    user_type: str | None = field(None, enum=lr_methods,
                                  doc="A user-registered learning-rate method.")
    base_lr: float = field(0.01, lower=0.0, finite=True, doc="Base learning rate.")


class UpdaterConf(ComponentConf):
    """The updater every server applies (SPEC §5); SINGA's ``updater { ... }``."""

    registry: ClassVar = updaters
    type: str = field("kSGD", enum=updaters, doc="Update method.")
    user_type: str | None = field(None, enum=updaters, doc="A user-registered updater.")
    learning_rate: LRGenConf = field(factory=LRGenConf, doc="Learning-rate change method.")
    momentum: float = field(0.0, lower=0.0, upper=1.0, doc="Momentum.")
    weight_decay: float = field(0.0, lower=0.0, finite=True,
                                doc="Weight decay (L2) coefficient.")
    delta: float = field(1e-8, lower=0.0, lower_exclusive=True, finite=True,
                         doc="Small constant that keeps divisions finite (epsilon).")
    clip_low: float = field(0.0, not_nan=True,
                            doc="Gradients are clamped into [clip_low, clip_high] when "
                                "clip_high > clip_low; -inf or inf clips on one side only "
                                "(clip_low: -inf clip_high: 5).")
    clip_high: float = field(0.0, not_nan=True, doc="See clip_low.")
    clip_norm: float = field(0.0, lower=0.0, finite=True,
                             doc="When > 0, clip the gradients by their global norm: every "
                                 "gradient of the job is multiplied by min(1, clip_norm / "
                                 "(norm + 1e-6)), norm the L2 norm of all of them together "
                                 "(after clip_low/clip_high and the mean of shared gradients), "
                                 "as torch.nn.utils.clip_grad_norm_ does. On the cluster the "
                                 "servers reduce the norm across them once per step.")
    form: str = field("singa", enum=("singa", "torch", "mxnet"),
                      doc="The form of the rules: SINGA's (SPEC section 5), or torch.optim's "
                          "where the two differ: kSGD and kNesterov keep torch's momentum "
                          "buffer (buf = momentum*buf + (1 - dampening)*g; w -= lr*buf, so a "
                          "change of rate applies to all of it), kAdaGrad and kRMSProp add "
                          "delta after the square root, and kRMSProp uses momentum as "
                          "torch.optim.RMSprop does. The other methods are the same in both. "
                          "Or MXNet 1.9.1's (kSGD, kNesterov, kAdam, kAdaGrad, kRMSProp, "
                          "kAdaDelta, kFtrl, kSignum, kLAMB; docs/updaters.md): the clip "
                          "after rescale_grad (and, for kAdam and kRMSProp, after the weight "
                          "decay), kAdam's delta added before the bias correction, kAdaGrad's "
                          "and kAdaDelta's weight decay decoupled, the centred kRMSProp's "
                          "momentum buffer holding the steps.")
    rescale_grad: float = field(1.0, finite=True,
                                doc="Multiply every gradient by this before the update "
                                    "(MXNet's rescale_grad, often 1/batch size); beyond "
                                    "SINGA.")
    lazy_update: bool = field(True, doc="A row-sparse table's push updates only the rows "
                                        "pushed, their state only (true, MXNet's "
                                        "lazy_update); false: every row, as a dense update "
                                        "with a zero gradient elsewhere (state decays, weight "
                                        "decay acts on every row).")
    state_dtype: str = field("float32", enum=STATE_DTYPES,
                             doc="How the method keeps its per-element state (histories, "
                                 "moments): float32 (as the values), bfloat16 (half the "
                                 "bytes), or int8 (8-bit codes with a float32 scale per "
                                 "block of 256: about a quarter). Smaller state is a faster "
                                 "step and a larger model per server; beyond SINGA. Needs "
                                 "float32 Params and a built-in method.")
    stochastic_rounding: bool = field(False, doc="Round bfloat16 and int8 state "
                                                 "stochastically (up with the probability "
                                                 "of the distance, so that small changes "
                                                 "are kept on average) instead of to "
                                                 "nearest; reproducible (drawn from the "
                                                 "update count).")
    value_dtype: str = field("float32", enum=VALUE_DTYPES,
                             doc="The values workers read: float32, or bfloat16 with a float32 "
                                 "master copy kept in the updater's state (role 'master'): "
                                 "the update runs on the master, and the values become its "
                                 "rounding to bfloat16 (nearest, ties to even), in the same "
                                 "pass. Needs float32 Params and one server group; beyond "
                                 "SINGA.")


class CDConf(Parameter):
    """``cd_conf`` of the contrastive-divergence algorithm (kCD)."""

    cd_k: int = field(1, lower=1, doc="Steps of Gibbs sampling per update.")


class TrainOneBatchConf(Parameter):
    """The algorithm of one training step; SINGA's ``train_one_batch { alg: kBP }``
    (``AlgProto``)."""

    alg: str = field("kBP", enum=ALG_TYPE,
                     doc="kBP (back-propagation), kCD (contrastive divergence, for RBMs; also "
                         "written kContrastiveDivergence), kBPTT (back-propagation through "
                         "time, for unrolled RNNs) or kUserAlg (user_alg). SINGA's default is "
                         "kUserAlg; here kBP. User algorithms are not built: check lists "
                         "them, train refuses them.")
    user_alg: str | None = field(None, doc="A user's algorithm (alg: kUserAlg); not built.")
    cd_conf: CDConf = field(factory=CDConf, doc="Configuration of kCD.")

    def unbuilt(self) -> str | None:
        """What of this algorithm is not built yet, or None."""
        if self.alg == "kUserAlg" or self.user_alg is not None:
            return f"user training algorithm {self.user_alg!r} (kUserAlg)"
        return None


class LayerConf(ComponentConf):
    """One layer of the net; SINGA's ``layer { ... }`` (``LayerProto``)."""

    registry: ClassVar = layers
    name: str = field(doc="Name of the layer, unique in each phase (layers of different "
                          "phases may share a name, e.g. two data layers 'data', one "
                          "'include: kTrain', one 'include: kTest').")
    type: str | None = field(None, enum=layers, doc="Layer type (or give user_type); SINGA's "
                                                    "default kUserLayer means user_type.")
    user_type: str | None = field(None, doc="A layer type registered by the user (--import); "
                                            "SINGA's user layers are apart from its built-in "
                                            "ones, and so are they here.")
    srclayers: list[str] = field(factory=list, doc="Names of the layers this one reads.")
    param: list[ParamConf] = field(factory=list, doc="The layer's Params, in order.")
    exclude: list[str] = field(factory=list, enum=PHASE,
                               doc="Phases whose nets leave this layer out (SINGA deprecated "
                                   "it for include).")
    include: list[str] = field(factory=list, enum=PHASE,
                               doc="Phases whose nets have this layer (when given, only "
                                   "these): kTrain, kVal, kTest. A layer has either include "
                                   "or exclude.")
    share_src_blobs: bool = field(False, doc="Share data memory with the source layer; no "
                                             "effect on values (a memory saving of SINGA's).")
    unroll_len: int | None = field(None, lower=1, doc="Copies of the layer when the net is "
                                                      "unrolled (kBPTT); None: the net's "
                                                      "unroll_len (SINGA's rule).")
    unroll_index: int = field(0, lower=0, doc="Set internally by SINGA when unrolling; no "
                                              "effect.")
    unroll_conn_type: list[str] = field(factory=list, enum=UNROLL_CONN_TYPE,
                                        doc="Per source, how each unrolled copy connects to "
                                            "the source's copies: kUnrollOneToOne (default: "
                                            "copy t reads copy t - shift), kUnrollOneToAll "
                                            "(every copy), kUnrollFirstToLast (copy 0 reads "
                                            "the last). kUnrollCustomized is refused, as "
                                            "SINGA never built it.")
    shift: list[int] = field(factory=list, lower=0,
                             doc="Per source, how many steps back a kUnrollOneToOne copy "
                                 "reads (copies before it read nothing from that source).")
    partition_dim: int = field(-1, lower=-1, upper=1,
                               doc="How the workers of a group share this layer: 0, the "
                                   "batch (each computes its rows, with all the Params); 1, "
                                   "the features (each computes its part of the outputs for "
                                   "the whole batch, with its part of the Params); -1: the "
                                   "net's. Input and loss layers always take the batch.")
    partition_id: int = field(0, lower=0, doc="Set internally by SINGA; no effect.")
    num_partitions: int = field(1, lower=1, doc="Set internally by SINGA; no effect.")

    @classmethod
    def _build(cls, block: Block, unknown: dict[str, Any] | None = None) -> Any:
        user = next((e.value.raw for e in block.entries if e.key == "user_type" and
                     isinstance(e.value, Scalar) and not e.extension), None)
        if isinstance(user, str) and user != "None" and layers.user_lookup(user) is None:
            # A user layer that is not registered: its own blocks cannot be read without its
            # class; the rest is checked, and check/train report the layer type.
            keep = [e for e in block.entries
                    if not e.extension and not e.key.endswith("_conf")]
            return Parameter._build.__func__(cls, Block(keep, block.where),  # type: ignore
                                             unknown)
        return super()._build(block, unknown)

    @property
    def component(self) -> str:
        if self.user_type is not None:
            found = layers.user_lookup(self.user_type)
            if found is None:
                raise ParamError(f"layer '{self.name}': user layer type '{self.user_type}' is "
                                 "not registered: load the module that registers it with "
                                 "--import")
            return found
        return super().component

    def check(self) -> list[str]:
        problems = []
        if self.type is None and self.user_type is None:
            problems.append(f"layer '{self.name}' needs a type (or a user_type); known types: "
                            f"{layers.choices()}")
        if "kUnrollCustomized" in self.unroll_conn_type:
            problems.append(f"layer '{self.name}': unroll_conn_type kUnrollCustomized is not "
                            "built, in SINGA either; use kUnrollOneToOne, kUnrollOneToAll or "
                            "kUnrollFirstToLast")
        if self.include and self.exclude:
            problems.append(f"layer '{self.name}' has both include and exclude; SINGA refuses "
                            "that too: give the phases it runs in (include) or those it does "
                            "not (exclude)")
        return problems

    def runs_in(self, phase: str) -> bool:
        """Whether the net of ``phase`` (``kTrain``, ``kVal``, ``kTest``, ...) has this
        layer: SINGA's rule for include and exclude."""
        phase = PHASE.lookup(phase)
        if self.include:
            return phase in self.include
        return phase not in self.exclude

    def unbuilt(self) -> str | None:
        """What of this layer is not built yet (its type, as a phrase), or None."""
        if self.user_type is not None and layers.user_lookup(self.user_type) is None:
            return f"user layer type {self.user_type} (not registered: load the module that " \
                   "registers it with --import)"
        if self.type is not None and not self.user_type and not layers.is_sentinel(self.type):
            if not getattr(layers.get(self.type), "built", True):
                return f"layer type {layers.lookup(self.type)}"
        return None


class LayerGroupConf(Parameter):
    """``layer_group`` of the net (v0.2.0+): layers unrolled together (kBPTT)."""

    layer: list[str] = field(factory=list, doc="Names of the layers of the group.")


class NetConf(Parameter):
    """The neural net: its layers in order; SINGA's ``neuralnet { ... }`` (``NetProto``)."""

    layer: list[LayerConf] = field(factory=list, doc="The layers.")
    partition_dim: int = field(0, lower=-1, upper=1,
                               doc="Default partition_dim of the layers: 0 (the batch), 1 (the "
                                   "features) or -1 (the batch as well: with several workers "
                                   "in a group every layer is partitioned).")
    layer_group: list[LayerGroupConf] = field(factory=list, doc="Groups of layers unrolled "
                                                                "together; no effect, as in "
                                                                "SINGA, which reads it "
                                                                "nowhere.")
    unroll_len: int = field(1, lower=1, doc="Copies of every layer that does not give its "
                                            "own unroll_len when the net is unrolled (kBPTT).")

    def phase_layers(self, phase: str) -> list[LayerConf]:
        """The layers of the net built for ``phase``, in file order."""
        return [layer for layer in self.layer if layer.runs_in(phase)]

    def phase_problems(self, phase: str) -> list[str]:
        """What keeps the net of ``phase`` from being built: a name used twice in it, a
        source that the phase leaves out."""
        active = self.phase_layers(phase)
        problems, seen = [], set()
        for layer in active:
            if layer.name in seen:
                problems.append(f"layer name '{layer.name}' is used twice in phase {phase}")
            seen.add(layer.name)
        every = {layer.name for layer in self.layer}
        problems += [f"layer '{layer.name}' reads '{src}', which is excluded from {phase}; "
                     f"exclude '{layer.name}' too"
                     for layer in active for src in layer.srclayers
                     if src in every and src not in seen]
        return problems

    def unbuilt(self) -> dict[str, list[str]]:
        """The types not built yet, each with the names of the layers that have it."""
        out: dict[str, list[str]] = {}
        for layer in self.layer:
            what = layer.unbuilt()
            if what is not None and layer.name not in out.setdefault(what, []):
                out[what].append(layer.name)
        return out

    def check(self) -> list[Problem]:
        # Layers of different phases may share a name; the net of kTrain, which every run
        # builds, may not (SINGA's would not build). Other phases are checked when their nets
        # are built: a phase SINGA never builds (kVal without validation) may be incomplete.
        problems, seen = [], set()
        for i, layer in enumerate(self.layer):
            if layer.runs_in("kTrain"):
                if layer.name in seen:
                    problems.append(Problem(f"layer name '{layer.name}' is used twice in "
                                            "phase kTrain", f"layer[{i}].name"))
                seen.add(layer.name)
        every = [x.name for x in self.layer]
        known = set(every)
        for i, layer in enumerate(self.layer):
            for k, src in enumerate(layer.srclayers):
                if src not in known:
                    earlier = every[:i]  # what it may read
                    close = difflib.get_close_matches(src, earlier[::-1], n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    problems.append(Problem(f"layer '{layer.name}' reads unknown layer "
                                            f"'{src}'{hint}", f"layer[{i}].srclayers[{k}]"))
        return problems


#: Most workers or servers in a group, and most groups: each is a thread (embedded) or a Ray
#: actor with its own share of the job, so a count beyond this is a typing mistake, and
#: planning for 2**31 servers would take minutes and gigabytes before anything is said.
MAX_NODES = 4096


class ClusterConf(Parameter):
    """Servers and workers (SPEC §7); SINGA's ``cluster { ... }`` (``ClusterProto``)."""

    nworker_groups: int = field(1, lower=1, upper=MAX_NODES,
                                doc="Worker groups; asynchronous to each other.")
    nserver_groups: int = field(1, lower=1, upper=MAX_NODES,
                                doc="Server groups, each holding all Params.")
    nworkers_per_group: int = field(1, lower=1, upper=MAX_NODES,
                                    doc="Workers in a group; synchronous (BSP).")
    nservers_per_group: int = field(1, lower=1, upper=MAX_NODES,
                                    doc="Servers in a group; each holds slices.")
    nworkers_per_procs: int = field(1, lower=1, upper=MAX_NODES,
                                    doc="Workers per process in SINGA; no effect here: "
                                        "embedded, every worker is a thread of one process; "
                                        "on Ray, an actor each.")
    nservers_per_procs: int = field(1, lower=1, upper=MAX_NODES,
                                    doc="Servers per process in SINGA; no effect here (see "
                                        "nworkers_per_procs).")
    server_worker_separate: bool = field(False, doc="Run servers apart from workers.")
    sync_freq: int = field(1, lower=1, doc="Steps between synchronisations of server groups.")
    start_port: int = field(6723, lower=0, upper=65535,
                            doc="SINGA's first ZeroMQ port; no effect: embedded servers and "
                                "workers are threads and talk in memory; Ray chooses its "
                                "own ports.")
    share_memory: bool = field(True, doc="Whether SINGA's worker groups in one process share "
                                         "Param memory; no effect: the worker groups of a "
                                         "server group here always read its values in place.")
    poll_time: int = field(100, lower=0, doc="SINGA's socket poll time in milliseconds; no "
                                             "effect (waits here are woken by events; see "
                                             "timeout).")
    staleness: int | None = field(None, lower=0, doc="Bounded staleness: a worker may run at "
                                                     "most this many versions ahead.")
    workspace: str | None = field(None, path=True,
                                  doc="Folder for checkpoints and metrics (SINGA "
                                      "keeps it here; job.workspace wins). Given, it "
                                      "makes the job a SINGA job: SINGA's test "
                                      "schedule and checkpoints (docs/singa.md; "
                                      "installed: paramserver/docs/singa.md).")
    backend: str = field("local", enum=("local", "ray"), doc="Where servers and workers run.")
    ray_address: str | None = field(None, doc="Address of an existing Ray cluster.")
    placement: str = field("spread", enum=("spread", "pack"),
                           doc="On Ray: the actors on as many nodes as Ray can (spread), or "
                               "on as few (pack: Ray's default, the driver's node first).")
    server_resource: str | None = field(None, doc="On Ray: servers only on the nodes that "
                                                  "have this resource (ray start "
                                                  "--resources='{\"NAME\": 1}').")
    worker_resource: str | None = field(None, doc="On Ray: workers only on the nodes that "
                                                  "have this resource.")
    timeout: float = field(60.0, lower=0.0, lower_exclusive=True,
                           doc="Seconds any wait may take before it is an error.")
    on_worker_failure: str = field("stop", enum=("stop", "continue"),
                                   doc="Stop the job, or go on without a dead worker.")
    nonfinite: str = field("error", enum=("error", "skip"),
                           doc="A gradient with NaN or Inf: stop with an error, or skip it.")


class JobConf(Parameter):
    """A training job; SINGA's ``job.conf`` (``JobProto``)."""

    name: str = field("job", doc="Name of the job (SINGA v0.1.0 required it).")
    train_steps: int = field(0, lower=0, doc="Number of training steps (SINGA v0.1.0 required "
                                             "it; 0: no training, e.g. a job that tests or "
                                             "samples from checkpoint_path).")
    disp_freq: int = field(0, lower=0, doc="Steps between progress reports and train rows of "
                                           "metrics.csv (0: about 30 per run).")
    disp_after: int = field(0, lower=0, doc="First step of the progress reports; then every "
                                            "disp_freq steps.")
    gpu: list[int] = field(factory=list, lower=0,
                           doc="SINGA's GPU device ids, one per worker (in turn): each "
                               "worker's net computes on cuda:<id> when torch sees that GPU, "
                               "else on the CPU (with a warning). Tests run on the first.")
    test_freq: int = field(0, lower=0, doc="Steps between tests, from test_after (0: no tests "
                                           "during training). With test_freq or test_steps "
                                           "a test runs at the end too; a SINGA job (one "
                                           "with cluster { workspace }) tests at step 0 "
                                           "instead, as SINGA did.")
    test_steps: int = field(0, lower=0, doc="Batches per test (0: the whole test split; SINGA "
                                            "ran no tests then).")
    test_after: int = field(0, lower=0, doc="First step at which tests run; then every "
                                            "test_freq steps.")
    validate_freq: int = field(0, lower=0, aliases=("valid_freq",),
                               doc="Steps between validations (the kVal net on the "
                                   "validation data), from validate_after; rows 'val' of "
                                   "metrics.csv. 0: none.")
    validate_steps: int = field(0, lower=0, aliases=("valid_steps",),
                                doc="Batches per validation (0: the whole validation "
                                    "split).")
    validate_after: int = field(0, lower=0, doc="First step at which validations run; then "
                                                "every validate_freq steps.")
    checkpoint_freq: int = field(0, lower=0, doc="Steps between checkpoints, from "
                                                 "checkpoint_after (0: only the one at the "
                                                 "end of training, written always). A SINGA "
                                                 "job (cluster { workspace }) writes SINGA's "
                                                 "step<N>-worker0 beside each.")
    checkpoint_after: int = field(0, lower=0, doc="First step at which checkpoints are "
                                                  "written; then every checkpoint_freq steps.")
    checkpoint_path: list[str] = field(factory=list, path=True,
                                       doc="SINGA checkpoints (step<N>-worker<M>, relative "
                                           "to the working folder) whose Params initialise "
                                           "the job's of the same name, in order (a later "
                                           "file wins); others are initialised by init.")
    warmup_steps: int = field(0, lower=0, doc="SINGA's steps before the first put to the "
                                              "servers; no effect, as in SINGA v0.2.0+, "
                                              "whose warm-up loop was disabled.")
    debug: bool = field(False, doc="Extra checks while training.")
    reset_param_version: bool = field(True, doc="Params loaded from checkpoint_path count "
                                                "their versions from step (true) or from the "
                                                "checkpoint's versions (false); these "
                                                "versions are written into SINGA "
                                                "checkpoints.")
    num_openblas_threads: int = field(1, lower=1, doc="Threads of each worker's layer "
                                                      "computation (SINGA's OpenBLAS "
                                                      "threads; here PyTorch's intra-op "
                                                      "threads, set for the run). 1, "
                                                      "SINGA's default, is fastest for "
                                                      "small layers; give more for large "
                                                      "convolutions.")
    resume: bool = field(False, doc="Go on from the newest checkpoint in the workspace, as "
                                    "--resume does (refused when there is none: "
                                    "--resume-or-start starts then).")
    step: int = field(0, lower=0, doc="The first step of a new run (SINGA sets it when it "
                                      "resumes); the learning rate and data order follow it.")
    id: int = field(-1, doc="SINGA's job id, given by ZooKeeper; no effect.")
    workspace: str | None = field(None, path=True,
                                  doc="Folder for checkpoints, metrics and plots.")
    seed: int = field(0, lower=0, doc="Seed of every random choice of the job (init, data "
                                      "order).")
    train_one_batch: TrainOneBatchConf = field(factory=TrainOneBatchConf,
                                               doc="Algorithm of one step.")
    neuralnet: NetConf = field(factory=NetConf, doc="The neural net (SINGA v0.1.0 required "
                                                    "it).")
    updater: UpdaterConf = field(factory=UpdaterConf, doc="The updater.")
    cluster: ClusterConf = field(factory=ClusterConf, doc="Servers and workers (SINGA "
                                                          "v0.1.0 required it).")

    @property
    def workspace_dir(self) -> str:
        """The workspace: the job's ``workspace``, SINGA's ``cluster { workspace }``, or
        ``workspace/<name>``, for which the name must be one folder name (a name of
        ``../../x`` would put the run's files outside ``workspace/``)."""
        given = self.workspace or self.cluster.workspace
        if given:
            return given
        name = self.name
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\x00" in name:
            raise ParamError(f"name {name!r}: the job's workspace is workspace/<name> unless "
                             "one is given, so the name must be one folder name (not empty, "
                             "'.' or '..', without '/' or '\\'); rename the job or give a "
                             "workspace (--workspace, or workspace: in the job file)")
        return f"workspace/{name}"

    @property
    def singa_job(self) -> bool:
        """Whether this is a SINGA job: one that names its workspace SINGA's way, in
        ``cluster { workspace }`` (which SINGA required), rather than paramserver's (the top
        level's ``workspace``, or none). A SINGA job keeps SINGA's conventions: tests and
        validations at step 0 and no test added after the last step, and SINGA's
        checkpoints (``checkpoint/step<N>-worker0``) written beside paramserver's."""
        return self.cluster.workspace is not None

    def eval_phases(self) -> list[str]:
        """The phases whose nets the job evaluates: kTest when it tests (test_freq or
        test_steps), kVal when it validates (validate_freq)."""
        return ([*(["kTest"] if self.test_freq or self.test_steps else []),
                 *(["kVal"] if self.validate_freq else [])])

    def unbuilt(self) -> list[str]:
        """What this job needs that paramserver does not build yet: one line per layer type
        (with its layers) and per algorithm; empty when the job can run."""
        out = [f"{what}: layer{'s' if len(names) > 1 else ''} "
               + ", ".join(f"'{n}'" for n in names)
               for what, names in self.neuralnet.unbuilt().items()]
        alg = self.train_one_batch.unbuilt()
        if alg is not None:
            out.append(f"{alg}: train_one_batch")
        return out


def unbuilt_error(lines: list[str]) -> ParamError:
    """The error that names what a job needs and is not built yet."""
    return ParamError("this job needs what paramserver does not build yet:\n"
                      + "\n".join(f"  {line}" for line in lines))


def parse_job(text: str, filename: str = "<string>") -> JobConf:
    """Read a job from the text of a job file; errors name ``filename:line:column``."""
    from .textformat import parse_text, paused_gc

    block = parse_text(text, filename)
    with paused_gc():
        return JobConf._build(block)


#: The largest job file read. A job file holds settings (lists of a few thousand steps at
#: most), and reads at about 2 MB/s; a larger file is a data file given by mistake.
MAX_JOB_FILE_BYTES = 16 * 1024 * 1024


def load_job(path: str | Path) -> JobConf:
    """Read a job file: a regular file of UTF-8 text, at most :data:`MAX_JOB_FILE_BYTES`."""
    return parse_job(read_job_text(path), str(path))


def read_job_text(path: str | os.PathLike[str]) -> str:
    """The text of a job file, or a ParamError that names the file (and the line) and says
    why it cannot be one: not a regular file, unreadable, too large, not UTF-8 text."""
    try:
        # Looked at before it is opened: opening a pipe waits for a writer, and a device
        # (/dev/zero) never ends.
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ParamError(f"{path}: cannot read the job file: it is {kind}")
        with open(path, "rb") as f:  # read() of n bytes first takes n bytes of memory
            data = f.read(min(st.st_size, MAX_JOB_FILE_BYTES) + 1)
            if len(data) > st.st_size:  # it grew meanwhile: the rest, up to the limit
                data += f.read(MAX_JOB_FILE_BYTES + 1 - len(data))
    except OSError as e:
        raise ParamError(f"{path}: cannot read the job file: {e.strerror or e}") from None
    if len(data) > MAX_JOB_FILE_BYTES:
        size = os.path.getsize(path)
        raise ParamError(f"{path}: the job file is {size / 2**20:,.1f} MiB; job files of more "
                         f"than {MAX_JOB_FILE_BYTES // 2**20} MiB are refused (is it a data "
                         "file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ParamError(f"{path}:{line}: the job file is not UTF-8 text ({e.reason} at byte "
                         f"{e.start})") from None
    if not text.strip():
        raise ParamError(f"{path}: the job file is empty (a job needs at least train_steps "
                         "and neuralnet { ... })")
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ParamError(f"{path}:{line}: the job file is not text (it holds a NUL byte)")
    return text


def conf_from(cls: type[Any], x: Any, block_name: str) -> Any:
    """A configuration of ``cls`` from an instance, a nested dict, or the text of its block.

    The text may be the block's body (``type: kSGD momentum: 0.9``) or the whole block
    (``updater { type: kSGD }``).
    """
    if isinstance(x, cls):
        return x
    if isinstance(x, str):
        from .textformat import parse_text

        block = parse_text(x, f"<{block_name}>")
        if len(block.entries) == 1 and block.entries[0].key == block_name and isinstance(
                block.entries[0].value, Block):
            block = block.entries[0].value
        return cls._build(block)
    if isinstance(x, dict):
        return cls.parse(x)
    raise ParamError(f"expected a configuration ({cls.__name__}), a dict or the text of the "
                     f"{block_name} block, not {type(x).__name__}")


__all__ = ["MAX_JOB_FILE_BYTES", "MAX_NODES", "NET_PHASES", "CDConf", "ClusterConf", "JobConf",
           "LRGenConf", "LayerConf", "LayerGroupConf", "NetConf", "ParamConf", "ParamGenConf",
           "TrainOneBatchConf", "UpdaterConf", "conf_from", "load_job", "parse_job",
           "read_job_text", "unbuilt_error"]
