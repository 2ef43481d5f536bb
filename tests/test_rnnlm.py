"""Users' layers in their own namespace, and SINGA's rnnlm example (its layers a user's
module, loaded with --import) run as written on words made by ``paramserver data``."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from layer_tools import Source, check_gradients, make  # noqa: E402
from paramserver import ParamError  # noqa: E402
from paramserver.cli import main  # noqa: E402
from paramserver.config.components import USER, layers  # noqa: E402
from paramserver.config.job import LayerConf, parse_job  # noqa: E402
from paramserver.singa import stores  # noqa: E402
from paramserver.singa.datasets import write_text  # noqa: E402
from paramserver.singa.records import WordRecord  # noqa: E402
from paramserver.train.layers import DataLayer, Layer  # noqa: E402
from paramserver.train.metrics import MetricsLog  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rnnlm"
USER_LAYERS = ("kData", "kLabel", "kEmbedding", "kHidden", "kLoss")


def _forget() -> None:
    for name in USER_LAYERS:
        if f"{USER}{name}" in layers:
            layers.remove(f"{USER}{name}")
    sys.modules.pop("rnnlm", None)


@pytest.fixture
def rnnlm() -> Iterator[object]:
    """The example's module, imported (its layers registered) and forgotten after."""
    _forget()
    sys.path.insert(0, str(EXAMPLE))
    try:
        import rnnlm as module

        yield module
    finally:
        sys.path.remove(str(EXAMPLE))
        _forget()


def test_users_layers_have_their_own_namespace(rnnlm: object) -> None:
    assert layers.user_lookup("kData") == "user:kData"
    assert layers.lookup("kData") == "kData" and layers.get("kData") is DataLayer
    assert layers.get("user:kData") is rnnlm.RNNLMDataLayer  # type: ignore[attr-defined]
    conf = LayerConf.parse({"name": "d", "user_type": "kData",
                            "data_conf": {"path": "x.bin", "max_window": 3}})
    assert conf.component == "user:kData" and conf.own.max_window == 3
    builtin = LayerConf.parse({"name": "d", "type": "kData", "data_conf": {"batchsize": 4}})
    assert builtin.component == "kData" and builtin.own.batchsize == 4
    # a user's layer may also be named by type when no built-in layer has its name
    assert LayerConf.parse({"name": "h", "type": "kHidden"}).component == "user:kHidden"
    with pytest.raises(ParamError, match="already registered"):
        from paramserver.train.layers import register_layer

        register_layer("kHidden")(type("Again", (Layer,), {"__module__": "mine"}))


def test_an_unregistered_user_layer_is_reported_with_the_fix() -> None:
    _forget()
    job = parse_job('neuralnet { layer { name: "d" user_type: "kData" '
                    '[data_conf] { path: "x" } } }')
    lines = job.unbuilt()
    assert lines == ["user layer type kData (not registered: load the module that "
                     "registers it with --import): layer 'd'"]


def words(tmp_path: Path) -> Path:
    text = tmp_path / "t.txt"
    text.write_text("the cat sat\nthe dog sat on the cat\na cat\n" * 30)
    return text


def test_words_data_as_rnnlm_wrote_it(tmp_path: Path) -> None:
    out = tmp_path / "w.bin"
    written = write_text(str(words(tmp_path)), out, fmt="words", test_fraction=0,
                         classes=2)
    records = [WordRecord.FromString(v) for _, v in stores.read_kvfile(out)]
    assert written.count == len(records) == 30 * (3 + 6 + 2 + 3)
    vocab = {r.word: r.word_index for r in records}
    assert vocab["</s>"] == 0 and vocab["cat"] == 1  # by frequency, </s> first
    assert [r.word for r in records[:4]] == ["the", "cat", "sat", "</s>"]
    for r in records:
        assert r.class_start <= r.word_index < r.class_end
    assert {r.class_index for r in records} == {0, 1}
    capped = write_text(str(words(tmp_path)), out, fmt="words", test_fraction=0,
                        vocab_size=4, classes=2)
    assert capped.vocab == 4
    kept = {WordRecord.FromString(v).word for _, v in stores.read_kvfile(out)}
    assert kept == {"</s>", "cat", "the", "<unk>"}


def test_windows_follow_singas_reader(rnnlm: object, tmp_path: Path) -> None:
    ids = [5, 1, 2, 0, 3, 4, 1, 2, 3, 4, 0, 6]
    path = tmp_path / "w.bin"
    stores.write_kvfile(path, [(f"{i:05d}", WordRecord(word_index=w, class_end=7)
                                .SerializeToString()) for i, w in enumerate(ids)])
    _, windows = rnnlm.read_windows(str(path), 4)  # type: ignore[attr-defined]
    # row 0 of a window is the last word of the one before; a window ends at </s> (0) or
    # after 4 words
    assert windows == [(0, 4), (3, 8), (7, 11), (10, 12)]


def test_the_layers_gradients(rnnlm: object) -> None:
    rows = np.array([[0, 0, 0, 2], [1, 0, 0, 2], [3, 1, 2, 5], [4, 1, 2, 5], [0, 0, 0, 2]])
    data = Source(rows, "data", needs_grad=False)
    emb = make("user:kEmbedding", [data], "emb", embedding_conf={"word_dim": 3, "vocab_size": 5})
    run_rows = Source(np.random.default_rng(0).standard_normal((4, 3)), "x")
    hidden = make("user:kHidden", [run_rows], "hidden")
    loss = make("user:kLoss", [Source(np.random.default_rng(1).standard_normal((4, 3)), "h"),
                          data], "loss", loss_conf={"nclass": 2, "vocab_size": 5})
    check_gradients(emb)
    check_gradients(hidden)
    check_gradients(loss)


def test_rnnlm_example_runs_as_written(tmp_path: Path, rnnlm: object,
                                      capsys: pytest.CaptureFixture[str],
                                      caplog: pytest.LogCaptureFixture) -> None:
    old = os.getcwd()
    os.chdir(tmp_path)
    sys.modules.pop("rnnlm", None)  # --import registers it again
    for name in USER_LAYERS:
        layers.remove(f"{USER}{name}")
    try:
        for split, name in (("train", "train_data.bin"), ("val", "valid_data.bin")):
            write_text("pydoc", f"examples/rnnlm/{name}", fmt="words", split=split,
                       test_fraction=0, val_fraction=0.1, vocab_size=3720)
        shutil.copy(EXAMPLE / "job.conf", "job.conf")
        with caplog.at_level(logging.WARNING):
            assert main(["--import", "rnnlm", "train", "job.conf", "--steps", "30",
                         "--set", "disp_freq=10", "--set", "validate_freq=15", "--set",
                         "validate_steps=5"]) == 0
        out, err = capsys.readouterr()
        log = MetricsLog("examples/rnnlm/metrics.csv")
        log.load()
        train = [r.loss for r in log.rows if r.phase == "train"]
        assert all(math.isfinite(x) for x in train) and train[-1] < train[0], train
        # SINGA's schedule (a SINGA job): a validation at step 0 and at 15, none at the
        # last step (SINGA's worker stops before it)
        assert [(r.step, r.phase) for r in log.rows if r.phase == "val"] == [(0, "val"),
                                                                             (15, "val")]
        # rnnlm's perplexity, promised by its README: displayed, in metrics.csv and in
        # TensorBoard; its accuracy (none: NaN) neither warned of nor written
        # (each row's ppl: the mean of its steps' exp(loss), at least exp of their mean)
        assert "ppl" in log.extras and all(
            math.isfinite(r.extra["ppl"]) and r.extra["ppl"] >= 0.999 * math.exp(r.loss)
            for r in log.rows)
        assert re.search(r"train step 30/30 .*  ppl \d", out), out
        assert "step 15: validation loss " in out and ", ppl " in out
        assert "NaN" not in err and not [m for m in caplog.messages if "NaN" in m]
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator("examples/rnnlm/tensorboard")
        acc.Reload()
        tags = acc.Tags()["scalars"]
        assert {"train/ppl", "val/ppl", "train/loss"} <= set(tags)
        assert not [t for t in tags if t.endswith("accuracy")]
    finally:
        os.chdir(old)


def test_v010_rnnlm_runs_as_written_with_its_label_layer(cwd: Path, rnnlm: object) -> None:
    """SINGA v0.1.0's rnnlm job: its words in DataShard folders (Records holding them as
    their ``word`` extension, as its create_shard wrote them) and a kLabel layer between
    the data and the loss."""
    from paramserver.singa.records import word_record

    for split, name in (("train", "train_shard"), ("val", "valid_shard")):
        write_text("pydoc", f"examples/rnnlm/{name}", fmt="wordshard", split=split,
                   test_fraction=0, val_fraction=0.1, vocab_size=3720)
    first = stores.read_kvfile("examples/rnnlm/train_shard")[0][1]
    assert word_record(first, "x").word_index >= 0
    job = Path(__file__).parent / "data" / "singa" / "v0.1.0" / "examples" / "rnnlm" / "job.conf"
    assert main(["train", str(job), "--steps", "12", "--quiet", "--no-tensorboard",
                 "--set", "disp_freq=4", "--set", "validate_freq=6", "--set",
                 "validate_steps=3"]) == 0
    log = MetricsLog("examples/rnnlm/metrics.csv")
    log.load()
    train = [r.loss for r in log.rows if r.phase == "train"]
    assert len(train) == 3 and all(math.isfinite(x) for x in train), train
    assert [r.step for r in log.rows if r.phase == "val"] == [0, 6]  # none at the last
    assert "ppl" in log.extras
