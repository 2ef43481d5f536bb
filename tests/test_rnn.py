"""The GRU layer, back-propagation through time on the unrolled net (against a plain PyTorch
reference of the same recurrence), and SINGA's char-rnn example: train, then sample."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from layer_tools import Source, check_gradients, make, run  # noqa: E402
from paramserver import ParamError  # noqa: E402
from paramserver.cli import main  # noqa: E402
from paramserver.config.job import parse_job  # noqa: E402
from paramserver.singa.datasets import write_text  # noqa: E402
from paramserver.train.metrics import MetricsLog  # noqa: E402
from paramserver.train.net import Net  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "singa" / "char-rnn"


def gru_reference(x: torch.Tensor, h: torch.Tensor | None, w: list[torch.Tensor]
                  ) -> torch.Tensor:
    h = torch.zeros(x.shape[0], w[3].shape[0], dtype=x.dtype) if h is None else h
    b = w[6:] if len(w) == 9 else [0, 0, 0]
    z = torch.sigmoid(x @ w[0].T + h @ w[3].T + b[0])
    r = torch.sigmoid(x @ w[1].T + h @ w[4].T + b[1])
    c = torch.tanh(r * (h @ w[5].T) + x @ w[2].T + b[2])
    return z * h + (1 - z) * c


@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("params", [0, 6, 9])
def test_gru_values_and_gradients(context: bool, params: int) -> None:
    srcs = [Source(np.random.default_rng(0).standard_normal((3, 4)), "x")]
    if context:
        srcs.append(Source(np.random.default_rng(1).standard_normal((3, 5)), "h"))
    gru = make("kGRU", srcs, gru_conf={"dim_hidden": 5},
               param=[{"name": f"p{i}"} for i in range(params)])
    assert len(gru.param_shapes()) == (6 if params == 6 else 9)  # SINGA: biases past 6
    assert gru.param_shapes()[:6] == [(5, 4)] * 3 + [(5, 5)] * 3
    run(gru)
    want = gru_reference(srcs[0].data, srcs[1].data if context else None, gru.weights)
    np.testing.assert_allclose(gru.data.numpy(), want.detach().numpy(), rtol=1e-12)
    check_gradients(gru)


def test_gru_checks_its_state_source() -> None:
    with pytest.raises(ParamError, match=r"its second srclayer 'h' \(the state before\) "
                                         r"gives \(4,\), not \(5,\)"):
        make("kGRU", [Source(np.zeros((2, 3)), "x"), Source(np.zeros((2, 4)), "h")],
             gru_conf={"dim_hidden": 5})


def char_job(tmp_path: Path, unroll: int = 3, batch: int = 2, hidden: int = 4) -> str:
    text = tmp_path / "t.txt"
    text.write_text("abcab cba abc cab bca " * 20)
    vocab = tmp_path / "v.txt"
    write_text(str(text), tmp_path / "in.txt", test_fraction=0, vocab=vocab)
    return f"""
      train_one_batch {{ alg: kBPTT }}
      neuralnet {{
        unroll_len: {unroll}
        layer {{ name: "data" type: kCharRNN unroll_len: 1 char_rnn_conf {{
                 path: "{tmp_path / 'in.txt'}" vocab_path: "{vocab}" batchsize: {batch}
                 unroll_len: {unroll} }} }}
        layer {{ name: "onehot" type: kOneHot srclayers: "data" unroll_conn_type: kUnrollOneToAll
                 onehot_conf {{ vocab_size: 4 }} }}
        layer {{ name: "label" type: kRNNLabel srclayers: "data"
                 unroll_conn_type: kUnrollOneToAll }}
        layer {{ name: "gru" type: kGRU srclayers: "onehot" gru_conf {{ dim_hidden: {hidden} }}
                 {' '.join(f'param {{ name: "g{i}" init {{ type: kUniform low: -0.5 high: '
                           f'0.5 }} }}' for i in range(9))} }}
        layer {{ name: "ip" type: kInnerProduct srclayers: "gru"
                 innerproduct_conf {{ num_output: 4 }}
                 param {{ name: "w" init {{ type: kUniform low: -0.5 high: 0.5 }} }}
                 param {{ name: "b" init {{ type: kUniform low: -0.5 high: 0.5 }} }} }}
        layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "label" }}
      }}"""


def test_unrolling_names_and_connects_the_copies(tmp_path: Path) -> None:
    net = Net(parse_job(char_job(tmp_path)).neuralnet, phases=("kTrain",))
    names = [x.name for x in net.layers]
    assert names[:4] == ["data", "0#onehot", "1#onehot", "2#onehot"]
    assert [s.name for s in net["2#gru"].srcs] == ["2#onehot", "1#gru"]
    assert [s.name for s in net["0#gru"].srcs] == ["0#onehot"]
    assert [s.name for s in net["1#loss"].srcs] == ["1#ip", "1#label"]
    assert [s.name for s in net["1#onehot"].srcs] == ["data"]
    # the copies share one set of Params, named as written
    assert [s.name for s in net.param_specs()] == [f"g{i}" for i in range(9)] + ["w", "b"]


def test_bptt_against_a_plain_pytorch_reference(tmp_path: Path) -> None:
    net = Net(parse_job(char_job(tmp_path)).neuralnet, dtype=np.float64, phases=("kTrain",))
    pset = net.make_params()
    batch = net.batch(1)
    metrics = net.train_step(batch)
    ids = torch.from_numpy(batch.x)  # (batch, unroll + 1)
    w = [torch.tensor(pset[f"g{i}"].data, requires_grad=True) for i in range(9)]
    wo = torch.tensor(pset["w"].data, requires_grad=True)
    bo = torch.tensor(pset["b"].data, requires_grad=True)
    h, losses = None, []
    for t in range(3):
        x = torch.nn.functional.one_hot(ids[:, t], 4).double()
        h = gru_reference(x, h, w)
        losses.append(torch.nn.functional.cross_entropy(h @ wo.T + bo, ids[:, t + 1]))
    total = torch.stack(losses).sum()  # the objective: each copy's mean, summed over time
    total.backward()
    for i in range(9):
        np.testing.assert_allclose(pset[f"g{i}"].grad, w[i].grad.numpy(), rtol=1e-9,
                                   atol=1e-12)
    np.testing.assert_allclose(pset["w"].grad, wo.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(pset["b"].grad, bo.grad.numpy(), rtol=1e-9)
    assert metrics["loss"] == pytest.approx(float(total.detach()) / 3)  # the mean per step


def test_char_rnn_batches_follow_singas_reader(tmp_path: Path) -> None:
    net = Net(parse_job(char_job(tmp_path, unroll=5, batch=3)).neuralnet, phases=("kTrain",))
    data = net.data_layer
    ids = data.ids  # type: ignore[attr-defined]
    part = len(ids) // 3
    b0, b1 = data.batch(0), data.batch(1)
    np.testing.assert_array_equal(b0.x[1], ids[part:part + 6])
    np.testing.assert_array_equal(b1.x[0], ids[5:11])  # the next step goes on 5 further
    last = data.batch(data.steps_per_epoch - 1)
    assert last.x[2, -1] == ids[2 * part + (data.steps_per_epoch - 1) * 5 + 5]
    np.testing.assert_array_equal(data.batch(data.steps_per_epoch).x, b0.x)  # a new epoch


def test_char_rnn_trains_then_samples(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SINGA's char-rnn job, then its sampling job from the checkpoint the first wrote
    (small sizes by --set: 16 hidden units, 8 steps unrolled)."""
    write_text("pydoc", "examples/char-rnn/linux_input.txt", fmt="text", test_fraction=0.9,
               vocab="examples/char-rnn/vocab.txt", vocab_size=101)
    shutil.copy(EXAMPLES / "job.conf", "job.conf")
    shutil.copy(EXAMPLES / "sample.conf", "sample.conf")
    small = ["--set", "neuralnet.unroll_len=8",
             "--set", "neuralnet.layer[data].char_rnn_conf.unroll_len=8",
             "--set", "neuralnet.layer[gru1].gru_conf.dim_hidden=16"]
    assert main(["train", "job.conf", "--steps", "6", "--quiet", "--no-tensorboard",
                 "--set", "disp_freq=2", *small]) == 0
    log = MetricsLog("examples/char-rnn/metrics.csv")
    log.load()
    losses = [r.loss for r in log.rows if r.phase == "train"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert Path("examples/char-rnn/checkpoint/step6-worker0").exists()
    capsys.readouterr()
    assert main(["train", "sample.conf", "--quiet", "--no-tensorboard", "--overwrite",
                 "--set", "neuralnet.layer[gru1].gru_conf.dim_hidden=16",
                 "--set", "neuralnet.layer[gru2].gru_conf.dim_hidden=16",
                 "--set", "test_steps=30",
                 "--set", 'checkpoint_path=["examples/char-rnn/checkpoint/step6-worker0"]']
                ) == 0
    out = capsys.readouterr().out
    vocab = Path("examples/char-rnn/vocab.txt").read_text()
    sampled = out[:-1]
    assert len(sampled) == 30 and out.endswith("\n") and set(sampled) <= set(vocab)


def test_a_sampling_gru_keeps_its_state(tmp_path: Path) -> None:
    vocab = tmp_path / "v.txt"
    vocab.write_text("abcd")
    text = f"""neuralnet {{
      layer {{ name: "data" type: kRNNDummy rnn_dummy_conf {{ shape: 1 integer: true low: 0
               high: 4 dynamic_srclayer: "argsort" }} }}
      layer {{ name: "onehot" type: kOneHot srclayers: "data" }}
      layer {{ name: "gru" type: kGRU srclayers: "onehot" gru_conf {{ dim_hidden: 3 }}
               {' '.join(f'param {{ name: "g{i}" init {{ type: kUniform }} }}'
                         for i in range(6))} }}
      layer {{ name: "ip" type: kInnerProduct srclayers: "gru"
               innerproduct_conf {{ num_output: 4 }} }}
      layer {{ name: "softmax" type: kSoftmax srclayers: "ip" }}
      layer {{ name: "argsort" type: kArgSort srclayers: "softmax" }}
      layer {{ name: "out" type: kCharRNNOutput srclayers: "argsort"
               char_rnn_conf {{ vocab_path: "{vocab}" }} }} }}"""
    net = Net(parse_job(text).neuralnet, phases=("kTest",))
    net.make_params()
    assert net["onehot"].out_shape == (4,)  # from the dummy's high: SINGA's file gives none
    gru = net["gru"]
    assert gru.carries_state  # type: ignore[attr-defined]
    out = net["out"]
    out.stream = open(os.devnull, "w")  # type: ignore[attr-defined]
    net.evaluate(steps=5, phase="kTest")
    first = out.text  # type: ignore[attr-defined]
    states = []
    for batch in net.eval_batches("kTest", steps=3):
        net.forward(batch, "kTest")
        states.append(gru.data.clone())
    assert not torch.equal(states[1], states[2])
    before = out.text  # type: ignore[attr-defined]
    net.evaluate(steps=5, phase="kTest")  # a new evaluation starts from a zero state
    assert out.text == before + first  # type: ignore[attr-defined]
    assert len(first) == 5
    out.stream.close()  # type: ignore[attr-defined]
