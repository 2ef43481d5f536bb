"""SINGA's job files as SINGA wrote them: the whole job.proto of v0.1.0-v0.3.0 is declared,
every released example is read, and ``paramserver check`` lists only what is not built yet.

The .proto files and the examples are kept in tests/data/singa (Apache-2.0, see its README);
nothing is fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from paramserver.cli import main
from paramserver.config import ParamError, Parameter
from paramserver.config.components import ComponentRegistry, layers, lr_methods, updaters
from paramserver.config.job import (
    CDConf,
    ClusterConf,
    JobConf,
    LayerConf,
    LayerGroupConf,
    LRGenConf,
    NetConf,
    ParamConf,
    ParamGenConf,
    TrainOneBatchConf,
    UpdaterConf,
    load_job,
    parse_job,
)
from paramserver.config.singa_enums import (
    ACTIVATION_TYPE,
    ALG_TYPE,
    PARAM_TYPE,
    PHASE,
    POOL_METHOD,
    UNROLL_CONN_TYPE,
    UNUSED_ENUMS,
)
from paramserver.report import component_data, component_doc
from paramserver.singa import records

DATA = Path(__file__).resolve().parent / "data" / "singa"
VERSIONS = ("v0.1.0", "v0.2.0", "v0.3.0")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "singa.md"

# -- a small reader of .proto files (messages, fields, enums) -------------------------------


@dataclass(frozen=True)
class ProtoField:
    label: str
    type: str
    name: str
    number: int
    default: str | None


@dataclass
class ProtoMessage:
    fields: dict[str, ProtoField]
    enums: dict[str, dict[str, int]]


_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][\w.]*|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[{}=;\[\],]')


def read_proto(path: Path) -> tuple[dict[str, ProtoMessage], dict[str, dict[str, int]]]:
    text = re.sub(r"/\*.*?\*/", " ", path.read_text(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    tokens = _TOKEN.findall(text)
    messages: dict[str, ProtoMessage] = {}
    enums: dict[str, dict[str, int]] = {}
    pos = 0

    def enum_body() -> dict[str, int]:
        nonlocal pos
        values: dict[str, int] = {}
        while tokens[pos] != "}":
            if tokens[pos] == ";":
                pos += 1
                continue
            name, _, number = tokens[pos:pos + 3]
            values[name] = int(number)
            pos += 3
        pos += 1
        return values

    def message_body(name: str) -> None:
        nonlocal pos
        msg = ProtoMessage({}, {})
        while tokens[pos] != "}":
            t = tokens[pos]
            if t in ("optional", "required", "repeated"):
                ftype, fname, _, number = tokens[pos + 1:pos + 5]
                pos += 5
                default = None
                if tokens[pos] == "[":
                    end = tokens.index("]", pos)
                    opts = tokens[pos + 1:end]
                    if "default" in opts:
                        default = opts[opts.index("default") + 2].strip('"')
                    pos = end + 1
                msg.fields[fname] = ProtoField(t, ftype, fname, int(number), default)
            elif t == "enum":
                ename = tokens[pos + 1]
                pos += 3
                msg.enums[ename] = enum_body()
                continue
            elif t == "extensions":
                pos = tokens.index(";", pos)
            pos += 1
        pos += 1
        messages[name] = msg

    while pos < len(tokens):
        t = tokens[pos]
        if t == "message":
            name = tokens[pos + 1]
            pos += 3
            message_body(name)
        elif t == "enum":
            name = tokens[pos + 1]
            pos += 3
            enums[name] = enum_body()
        else:
            pos += 1
    return messages, enums


PROTOS = {v: read_proto(DATA / v / "src" / "proto" / "job.proto") for v in VERSIONS}
COMMON = {v: read_proto(DATA / v / "src" / "proto" / "common.proto") for v in VERSIONS}


def union_messages() -> dict[str, dict[str, ProtoField]]:
    out: dict[str, dict[str, ProtoField]] = {}
    for v in VERSIONS:
        for name, msg in PROTOS[v][0].items():
            for fname, f in msg.fields.items():
                out.setdefault(name, {}).setdefault(fname, f)
    return out


MESSAGES = union_messages()

# -- the declarations of each message -------------------------------------------------------

#: Messages of job.proto declared as a block of the job schema.
BLOCKS: dict[str, type[Parameter]] = {
    "JobProto": JobConf, "AlgProto": TrainOneBatchConf, "CDProto": CDConf,
    "NetProto": NetConf, "LayerGroupProto": LayerGroupConf, "LayerProto": LayerConf,
    "ParamProto": ParamConf, "UpdaterProto": UpdaterConf, "LRGenProto": LRGenConf,
    "ParamGenProto": ParamGenConf, "ClusterProto": ClusterConf,
}
#: Messages no field of any release uses (documented in docs/singa.md).
UNREACHABLE = {"UniformProto", "GaussianProto"}
#: Where paramserver's default differs from SINGA's, and why (docs/singa.md says so too).
DEFAULTS_DIFFER = {
    ("AlgProto", "alg"): "kUserAlg needs user_alg; kBP is what every example gives",
    ("UpdaterProto", "type"): "kUserUpdater needs user_type; kSGD",
    ("LRGenProto", "type"): "kUserChange needs user_type; kFixed",
    ("ParamGenProto", "type"): "kUserInit needs user_type; kConstant",
    ("LayerProto", "type"): "kUserLayer: the type is None until type or user_type is given",
    ("ParamProto", "name"): "'' is None here: generated <layer>_<index>",
    ("PoolingProto", "stride"): "v0.1.0 had 1, v0.2.0 and v0.3.0 have 2 (the latest kept)",
    ("StoreProto", "batchsize"): "v0.2.0's single value (1) became a repeated field",
    ("LayerProto", "unroll_len"): "1 unless given, then the net's: None says 'not given', "
                                  "which SINGA tells by has_unroll_len()",
}
TYPE_DEFAULT_SENTINELS = {"kUserAlg", "kUserUpdater", "kUserChange", "kUserInit",
                          "kUserLayer"}


def conf_class(owner: str, field: str) -> type[Parameter] | None:
    """The declaration of a *_conf field of a component message (by the registry)."""
    registry: ComponentRegistry = {"LayerProto": layers, "UpdaterProto": updaters,
                                   "LRGenProto": lr_methods}[owner]
    component = registry.by_conf_name(field)
    return None if component is None else registry.get(component).Config


def declaration(message: str) -> list[tuple[str, type[Parameter]]]:
    """Where the fields of a message are declared: ``[(how it is reached, class)]``."""
    if message in BLOCKS:
        return [(message, BLOCKS[message])]
    found = []
    for owner in ("LayerProto", "UpdaterProto", "LRGenProto"):
        for fname, f in MESSAGES[owner].items():
            if f.type == message:
                cls = conf_class(owner, fname)
                assert cls is not None, f"{owner}.{fname} ({message}) is not declared"
                found.append((f"{owner}.{fname}", cls))
    return found


def test_every_message_is_declared_or_unreachable() -> None:
    for message in MESSAGES:
        if message in UNREACHABLE:
            assert message in DOCS.read_text(), message
            continue
        assert declaration(message), f"{message} is reached by no declared field"


@pytest.mark.parametrize("message", sorted(set(MESSAGES) - UNREACHABLE))
def test_every_field_of_every_release_is_declared(message: str) -> None:
    """Each field of the union of v0.1.0-v0.3.0 is a field of the declaration, or (component
    messages) the *_conf block of a registered component with the right declaration."""
    for how, cls in declaration(message):
        keys = cls.__keys__
        for fname, f in MESSAGES[message].items():
            if fname.endswith("_conf") and f.type.endswith("Proto") and message in (
                    "LayerProto", "UpdaterProto", "LRGenProto"):
                assert conf_class(message, fname) is not None, f"{how}.{fname}"
                continue
            assert fname in keys, f"{how} ({cls.__name__}) lacks {fname}"


@pytest.mark.parametrize("message", sorted(set(MESSAGES) - UNREACHABLE))
def test_defaults_are_singas(message: str) -> None:
    """The latest release's default of every field, except where the SPEC or a conflict
    between releases says otherwise (DEFAULTS_DIFFER, each documented)."""
    for _, cls in declaration(message):
        fields = cls.fields()
        for fname, pf in MESSAGES[message].items():
            latest = next((PROTOS[v][0][message].fields[fname] for v in reversed(VERSIONS)
                           if message in PROTOS[v][0] and fname in PROTOS[v][0][message]
                           .fields), pf)
            if fname not in fields or (message, fname) in DEFAULTS_DIFFER:
                continue
            ours = fields[fname].make_default() if not fields[fname].required else None
            expected = _proto_default(latest)
            if latest.label == "repeated" or expected is _NO_DEFAULT:
                continue
            if isinstance(ours, float) or isinstance(expected, float):
                assert ours == pytest.approx(expected), f"{message}.{fname}"
            else:
                assert ours == expected, f"{message}.{fname}: {ours!r} != {expected!r}"


_NO_DEFAULT: Any = object()


def _proto_default(f: ProtoField) -> Any:
    if f.default is None:
        return _NO_DEFAULT
    if f.type in ("float", "double"):
        return float(f.default)
    if f.type in ("int32", "uint32", "int64"):
        return int(f.default)
    if f.type == "bool":
        return f.default == "true"
    return f.default


def test_rmsprop_and_adadelta_rho() -> None:
    assert updaters.get("kAdaDelta").Config().rho == 0.9  # SINGA's default (ours was 0.95)
    assert updaters.get("kRMSProp").Config().rho == 0.9   # SINGA requires it; SPEC: 0.9


# -- enums ----------------------------------------------------------------------------------

FIELD_ENUMS = {"Phase": PHASE, "AlgType": ALG_TYPE, "ParamType": PARAM_TYPE,
               "UnrollConnType": UNROLL_CONN_TYPE, "ActivationType": ACTIVATION_TYPE,
               "PoolMethod": POOL_METHOD}
COMPONENT_ENUMS: dict[str, ComponentRegistry] = {
    "LayerType": layers, "UpdaterType": updaters, "ChangeMethod": lr_methods}


def all_enums(version: str) -> dict[str, dict[str, int]]:
    messages, enums = PROTOS[version]
    out = dict(enums)
    for msg in messages.values():
        out.update(msg.enums)
    c_messages, c_enums = COMMON[version]
    out.update(c_enums)
    for name, msg in c_messages.items():
        out.update({f"{name}.{e}": v for e, v in msg.enums.items()})
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_enum_value_by_name_and_number(version: str) -> None:
    from paramserver.config.components import param_generators

    registries: dict[str, Any] = {**FIELD_ENUMS, **COMPONENT_ENUMS,
                                  "InitMethod": param_generators}
    for enum, values in all_enums(version).items():
        if enum in UNUSED_ENUMS:
            continue
        registry = registries[enum]
        for name, number in values.items():
            if (version, name) == ("v0.1.0", "kUserLayer"):
                assert registry.by_number(number) == "kPrefetch"  # v0.2.0's meaning of 102
                continue
            sentinel = getattr(registry, "user_sentinel", None)
            if name == sentinel:
                assert registry.by_number(number) == name
                continue
            assert registry.lookup(name) == name, (enum, name)
            assert registry.by_number(number) == name, (version, enum, name, number)


def test_unused_enums_are_documented() -> None:
    text = DOCS.read_text()
    for enum in UNUSED_ENUMS:
        assert f"`{enum}`" in text, enum


# -- common.proto ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_data_and_checkpoint_messages_match_common_proto(version: str) -> None:
    """The records paramserver reads and writes have SINGA's field names, numbers and types."""
    messages, _ = COMMON[version]
    ours = {"BlobProto": records.BlobProto, "BlobProtos": records.BlobProtos,
            "Record": records.Record, "RecordProto": records.RecordProto,
            "SingleLabelImageRecord": records.SingleLabelImageRecord,
            "CaffeDatum": records.CaffeDatum, "CaffeBlob": records.CaffeBlob}
    for name, msg in messages.items():
        if name == "MetricProto":
            assert "`MetricProto`" in DOCS.read_text()
            continue
        fields = ours[name].DESCRIPTOR.fields_by_name
        for fname, f in msg.fields.items():
            assert fname in fields, (name, fname)
            assert fields[fname].number == f.number, (name, fname)


# -- the examples ---------------------------------------------------------------------------

EXAMPLES = sorted(p for p in DATA.glob("v*/examples/*/*.conf") if p.name != "rbm_job.conf")

#: What `paramserver check` says each example needs that paramserver does not build.
UNBUILT = {
    "v0.1.0/examples/rnnlm/job.conf": {"user:kData", "user:kLabel", "user:kEmbedding",
                                       "user:kHidden", "user:kLoss"},
    "v0.2.0/examples/rnnlm/job.conf": {"user:kData", "user:kEmbedding", "user:kHidden",
                                       "user:kLoss"},
}


def unbuilt_in(err: str) -> set[str]:
    """The types a check's error lists; asserts that it lists nothing else."""
    lines = err.strip().splitlines()
    assert lines[0] == ("paramserver check: error: this job needs what paramserver does not "
                        "build yet:"), err
    found = set()
    for line in lines[1:]:
        m = re.fullmatch(r"  (layer type|user layer type|training algorithm) (\w+)[ :].*", line)
        assert m is not None, f"not a 'not built yet' line: {line!r}"
        found.add(("user:" if m.group(1) == "user layer type" else "") + m.group(2))
    return found


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(DATA)))
def test_check_reads_every_example_and_asks_only_for_its_data(
        capsys: pytest.CaptureFixture[str], path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every released example is read whole; in an empty working folder, check asks for
    the first data file it names (to be made by paramserver data), or lists what is not
    built (users' layers to --import)."""
    monkeypatch.chdir(tmp_path)
    code = main(["check", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    key = str(path.relative_to(DATA))
    if key in UNBUILT:
        assert unbuilt_in(err) == UNBUILT[key]
        return
    assert re.search(r"\((kRecordInput|kShardData|kCharRNN|kCharRNNOutput)\): (data store|"
                     r"vocab_path) '[^']+' does not exist \(make it with paramserver data",
                     err), err
    assert len(err.strip().splitlines()) == 1, err


def test_the_pre_release_rbm_job_is_refused_as_singa_refused_it() -> None:
    for v in VERSIONS[:2]:
        with pytest.raises(ParamError) as e:
            load_job(DATA / v / "examples" / "mnist" / "rbm_job.conf")
        assert re.match(r".*rbm_job.conf:9:1: Cannot find argument 'model'", str(e.value))


def test_an_example_is_read_whole() -> None:
    job = load_job(DATA / "v0.2.0" / "examples" / "cifar10" / "cudnn_hybrid.conf")
    assert job.gpu == [0, 1] and job.test_steps == 0 and job.cluster.nworkers_per_group == 2
    conv = next(x for x in job.neuralnet.layer if x.name == "conv1")
    assert conv.component == "kCudnnConv" and conv.partition_dim == 0
    assert conv.own.num_filters == 32 and conv.own.pad == 2
    relu = next(x for x in job.neuralnet.layer if x.type == "kCudnnActivation")
    assert relu.own.type == "RELU"
    assert [x.include for x in job.neuralnet.layer if x.name == "data"] == [["kTrain"],
                                                                          ["kTest"]]
    assert job.updater.learning_rate.own.step_lr == pytest.approx([0.001, 0.0001, 0.00001])
    rnn = load_job(DATA / "v0.2.0" / "examples" / "char-rnn" / "job.conf")
    assert rnn.train_one_batch.alg == "kBPTT" and rnn.neuralnet.unroll_len == 50
    assert rnn.neuralnet.layer[1].unroll_conn_type == ["kUnrollOneToAll"]
    assert rnn.updater.own.rho == 0.95 and (rnn.updater.clip_low, rnn.updater.clip_high) == (
        -5, 5)
    sample = load_job(DATA / "v0.2.0" / "examples" / "char-rnn" / "sample.conf")
    assert sample.train_steps == 0 and sample.checkpoint_path == [
        "examples/char-rnn/checkpoint/step2000-worker0"]


# -- grammar: what protobuf's text format accepts --------------------------------------------


def job(text: str) -> JobConf:
    return parse_job(f"neuralnet {{ }}\n{text}", "g.conf")


@pytest.mark.parametrize(("text", "value"), [
    ("train_steps: 0x10", 16), ("train_steps: 0X1f", 31), ("train_steps: 010", 8),
    ("train_steps: 0", 0), ("train_steps: 00", 0), ("train_steps: 12", 12),
    ("step: 0x7fffffff", 2**31 - 1),
])
def test_hex_and_octal_integers(text: str, value: int) -> None:
    conf = job(text)
    assert getattr(conf, text.split(":")[0]) == value


def test_hex_octal_and_booleans_in_other_fields() -> None:
    conf = job("cluster { nworkers_per_group: 0x2 start_port: 017 share_memory: f }\n"
               "debug: t resume: f updater { momentum: 0x0 clip_low: -010 }")
    assert (conf.cluster.nworkers_per_group, conf.cluster.start_port) == (2, 15)
    assert conf.cluster.share_memory is False and conf.debug is True and conf.resume is False
    assert conf.updater.momentum == 0.0 and conf.updater.clip_low == -8.0


def test_the_dmlc_path_still_refuses_hex() -> None:
    with pytest.raises(ParamError, match=r"Invalid Parameter format for train_steps expect "
                                         r"int but value='0x10'"):
        JobConf.parse({"train_steps": "0x10"})
    with pytest.raises(ParamError, match="expect boolean but value='t'"):
        JobConf.parse({"debug": "t"})


@pytest.mark.parametrize(("text", "where", "message"), [
    ("train_steps: 08", "g.conf:2:14", "invalid number '08': a leading 0 makes an integer octal"),
    ("train_steps: 0x1.5", "g.conf:2:1", "expect int but value='0x1.5'"),
    ("train_steps: t", "g.conf:2:1", "expect int but value='t'"),
    ("name: 0x10", "g.conf:2:1", "expect string but value='0x10'"),
    ("updater { type: 99 }", "g.conf:2:11", "Invalid Input: '99', no updater has this number; "
                                             "the numbers are: 1 = kSGD, 2 = kAdaGrad"),
    ("neuralnet { layer { name: \"a\" type: kReLU include: 3 } }", "g.conf:2:",
     "Invalid Input: '3', no phase has this number"),
])
def test_grammar_errors_name_their_place(text: str, where: str, message: str) -> None:
    with pytest.raises(ParamError) as e:
        parse_job(f"train_steps: 1\n{text}".replace("train_steps: 1\ntrain_steps", "\ntrain_steps"),
                  "g.conf")
    assert where in str(e.value) and message in str(e.value), str(e.value)


def test_enum_values_by_number() -> None:
    conf = parse_job("""
        train_one_batch { alg: 1 }
        updater { type: 3 rmsprop_conf { rho: 0.5 } learning_rate { type: 0x5
                  step_conf { change_freq: 10 gamma: 0.5 } } }
        neuralnet {
          layer { name: "d" type: 100 include: 1 include: 4 store_conf { backend: "kvfile" } }
          layer { name: "p" type: 207 exclude: 2 pooling_conf { pool: 1 } }
          layer { name: "c" type: 1 convolution_conf { num_filters: 4 } }
          layer { name: "a" type: 217 activation_conf { type: 2 }
                  unroll_conn_type: 3 param { type: 0 init { type: 4 } } }
        }""")
    assert conf.train_one_batch.alg == "kBP"
    assert conf.updater.component == "kRMSProp" and conf.updater.own.rho == 0.5
    assert conf.updater.learning_rate.component == "kStep"
    d, p, c, a = conf.neuralnet.layer
    assert (d.component, d.include) == ("kCSVInput", ["kTrain", "kTest"])
    assert (p.component, p.exclude, p.own.pool) == ("kPooling", ["kVal"], "AVG")
    assert c.component == "kConvolution"  # v0.1.0's number 1
    assert a.own.type == "SIGMOID" and a.unroll_conn_type == ["kUnrollFirstToLast"]
    assert a.param[0].type == "kParam" and a.param[0].init.component == "kGaussianSqrtFanIn"


def test_user_sentinels_select_user_type() -> None:
    conf = parse_job('neuralnet { } updater { type: kUserUpdater user_type: "kSGD" }')
    assert conf.updater.component == "kSGD"
    with pytest.raises(ParamError, match="type kUserUpdater selects a user's updater: name it "
                                         "with user_type"):
        parse_job("neuralnet { } updater { type: 105 }")


def test_include_and_exclude_together_are_refused() -> None:
    with pytest.raises(ParamError, match="layer 'd' has both include and exclude"):
        parse_job('neuralnet { layer { name: "d" type: kData include: kTrain exclude: kTest } }')


def test_user_param_types_are_refused() -> None:
    with pytest.raises(ParamError, match=r"user Param types .* are not supported"):
        parse_job('neuralnet { layer { name: "f" type: kReLU param { type: kUser '
                  'user_type: "P" } } }')


# -- documentation --------------------------------------------------------------------------


def test_doc_finds_every_singa_field() -> None:
    """``paramserver doc FIELD`` documents every field of the schema, with its effect."""
    for message in sorted(set(MESSAGES) - UNREACHABLE):
        for fname in MESSAGES[message]:
            text = component_doc(fname)
            assert f"{fname} :" in text or text.startswith(f"{fname} {{") or (
                f"reads {fname}:" in text), fname
    assert "no effect" in component_doc("start_port")
    assert "no effect" in component_doc("poll_time")
    assert "no effect" in component_doc("warmup_steps")
    assert "val" in component_doc("validate_freq")


def test_doc_of_a_field_as_json() -> None:
    data = component_data("pool")
    assert data["kind"] == "field" and len(data["places"]) == 1
    assert data["places"][0]["where"].startswith("kPooling reads pooling_conf")
    assert data["places"][0]["fields"][0]["enum"] == ["MAX", "AVG"]
    layer = component_data("layer")
    assert layer["kind"] == "configuration"
    assert {f["name"] for f in layer["fields"]} >= {"include", "exclude", "partition_dim"}
