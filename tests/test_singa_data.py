"""SINGA's data stores (kvfile, DataShard, CSV, mean files) and ``paramserver data``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli import main
from paramserver.config import ParamError
from paramserver.singa import stores
from paramserver.singa.datasets import resample, write_dataset
from paramserver.singa.records import CaffeBlob, Record, RecordProto
from paramserver.train.data import load_dataset, split_indices

# -- the formats, byte for byte --------------------------------------------------------------


def test_a_record_is_singas_bytes() -> None:
    """RecordProto {shape: 2 shape: 2 label: 3 pixel: "\\0\\1\\2\\3"} as protobuf writes it:
    tags in field order, the repeated int32 shape unpacked (proto2), the bytes verbatim."""
    x = np.arange(4, dtype=np.uint8).reshape(2, 2)
    value = stores.encode_sample(x, 3)
    assert value == bytes([0x08, 2, 0x08, 2, 0x10, 3, 0x1A, 4, 0, 1, 2, 3])
    data = stores.encode_sample(np.array([1.5], np.float32), None)
    assert data == bytes([0x08, 1, 0x22, 4]) + struct.pack("<f", 1.5)  # packed float data
    wrapped = stores.encode_sample(x, 3, wrap=True)
    assert wrapped == bytes([0x2A, len(value)]) + value  # Record { image: ... }, type unset
    assert Record.FromString(wrapped).type == 0  # kSingleLabelImage
    got, label = stores.decode_sample(wrapped, wrapped=True)
    np.testing.assert_array_equal(got, x)
    assert label == 3


def test_kvfile_layout() -> None:
    data = stores.encode_kvfile([("00000000", b"ab"), (b"k", b"xyz")])
    assert data == (struct.pack("<Q", 8) + b"00000000" + struct.pack("<Q", 2) + b"ab"
                    + struct.pack("<Q", 1) + b"k" + struct.pack("<Q", 3) + b"xyz")
    assert stores.decode_kvfile(data) == [(b"00000000", b"ab"), (b"k", b"xyz")]


@pytest.mark.parametrize(("cut", "message"), [
    (4, "record 0 at byte 0 is cut short (the file ends inside its key length)"),
    (10, "record 0 at byte 0 is cut short (its key of 8 bytes goes past the end"),
    (17, "record 0 at byte 0 is cut short (the file ends inside its value length)"),
    (44, "record 1 at byte 26 is cut short (its value of 3 bytes goes past the end"),
])
def test_a_cut_kvfile_is_refused(cut: int, message: str) -> None:
    data = stores.encode_kvfile([("00000000", b"ab"), (b"k", b"xyz")])
    with pytest.raises(ParamError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stores.decode_kvfile(data[:cut], "f.bin")


def test_what_singas_writer_refuses() -> None:
    with pytest.raises(ParamError, match="key b'a' of record 1 is used twice"):
        stores.encode_kvfile([("a", b"1"), ("a", b"2")])
    with pytest.raises(ParamError, match=r"record 0 .* has an empty value"):
        stores.encode_kvfile([("a", b"")])


def test_kvfile_in_a_folder_is_read_as_singa_does(tmp_path: Path) -> None:
    stores.write_kvfile(tmp_path / "shard" / "shard.dat", [("a", b"1")])
    assert stores.read_kvfile(tmp_path / "shard") == [(b"a", b"1")]


def test_bad_records_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    stores.write_kvfile(path, [("0", b"\xff\xff\xff")])
    with pytest.raises(ParamError, match=r"store '.*s.bin', record 0 \(key '0'\): not a "
                                         "RecordProto"):
        stores.read_records(path)
    stores.write_kvfile(path, [("0", stores.encode_sample(np.zeros(4, np.uint8), 1)),
                               ("1", stores.encode_sample(np.zeros(5, np.uint8), 1))])
    with pytest.raises(ParamError, match=r"record 1 .*pixels of shape \(5,\), unlike the "
                                         r"records before it \(\(4,\)\)"):
        stores.read_records(path)
    image = RecordProto(shape=[2, 3], pixel=b"abc")
    stores.write_kvfile(path, [("0", image.SerializeToString())])
    with pytest.raises(ParamError, match=r"3 values for shape \(2, 3\)"):
        stores.read_records(path)
    with pytest.raises(ParamError, match="does not exist"):
        stores.read_records(tmp_path / "none.bin")


# -- paramserver data: each store written and read back bit for bit --------------------------


def digits_split(split: str, **kw: float) -> tuple[np.ndarray, np.ndarray]:
    """The digits (0..16) of a split, as kData makes it (seed 0), in stored order."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    parts = split_indices(len(y), kw.get("test", 0.2), 0, kw.get("val", 0.0) or 0.0)
    index = {"train": 0, "test": 1, "val": 2}[split]
    rows = parts[index]
    return x[rows].reshape(-1, 8, 8), y[rows]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_kvfile_pixels_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "examples" / "mnist" / "test_data.bin"
    code, text, err = run(capsys, "data", "digits", str(out), "--split", "test")
    assert code == 0, err
    assert text.strip() == (f"{out}: 359 pixel records of shape 8,8 (kvfile; the test split "
                            "of digits)")
    x, y = digits_split("test")
    back = stores.read_records(out)
    assert back.x.dtype == np.uint8 and back.x.shape == (359, 8, 8)
    np.testing.assert_array_equal(back.x, np.rint(x * 255 / 16).astype(np.uint8))
    np.testing.assert_array_equal(back.y, y)
    keys = [k for k, _ in stores.read_kvfile(out)]
    assert keys[:2] == [b"00000000", b"00000001"]
    # written again from what was read: the same bytes
    again = tmp_path / "again.bin"
    stores.write_records(again, back)
    assert again.read_bytes() == out.read_bytes()


def test_shard_folder_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mnist_train_shard"
    code, _, err = run(capsys, "data", "digits", str(out), "--format", "shard", "--shape",
                       "28,28", "--mean", str(tmp_path / "image_mean.bin"))
    assert code == 0, err
    assert (out / "shard.dat").is_file()
    back = stores.read_records(out, "shard")
    x, y = digits_split("train")
    expected = np.rint(resample(x, (28, 28)) * 255 / 16).astype(np.uint8)
    np.testing.assert_array_equal(back.x, expected)
    np.testing.assert_array_equal(back.y, y)
    # each value is a v0.1.0 Record wrapping the image
    first = stores.read_kvfile(out / "shard.dat")[0][1]
    assert Record.FromString(first).image.shape == [28, 28]
    mean = stores.read_mean(tmp_path / "image_mean.bin", "shard")
    np.testing.assert_array_equal(mean, expected.astype(np.float64).mean(axis=0)
                                  .astype(np.float32))
    again = tmp_path / "again"
    stores.write_records(again, back, "shard")
    assert (again / "shard.dat").read_bytes() == (out / "shard.dat").read_bytes()


def test_csv_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "val.csv"
    code, text, err = run(capsys, "data", "digits", str(out), "--format", "csv", "--split",
                          "val", "--val-fraction", "0.1", "--scale", "0.0625",
                          "--mean", str(tmp_path / "mean.csv"))
    assert code == 0, err
    assert "180 CSV lines of shape 8,8 (textfile" in text
    x, y = digits_split("val", val=0.1)
    lines = out.read_text().splitlines()
    assert lines[0].split(",")[0] == str(y[0]) and len(lines[0].split(",")) == 65
    back = stores.read_records(out, "textfile", shape=(8, 8))
    np.testing.assert_array_equal(back.x, (x * 0.0625).astype(np.float32))
    np.testing.assert_array_equal(back.y, y)
    np.testing.assert_array_equal(stores.read_mean(tmp_path / "mean.csv", "textfile"),
                                  back.x.astype(np.float64).mean(axis=0).astype(np.float32)
                                  .reshape(-1))
    again = tmp_path / "again.csv"
    stores.write_csv(again, back)
    assert again.read_bytes() == out.read_bytes()


def test_float_records_and_kvfile_mean_from_an_npz(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20, 3, 4, 4)).astype(np.float32)
    y = rng.integers(0, 5, 20)
    src = tmp_path / "d.npz"
    np.savez(src, x=x, y=y)
    w = write_dataset(str(src), tmp_path / "all.bin", split="all", encoding="float",
                      mean=tmp_path / "mean.bin")
    assert (w.count, w.shape, w.encoding) == (20, (3, 4, 4), "float")
    back = stores.read_records(tmp_path / "all.bin")
    assert back.x.dtype == np.float32
    np.testing.assert_array_equal(back.x, x)
    np.testing.assert_array_equal(back.y, y)
    mean = stores.read_mean(tmp_path / "mean.bin")
    np.testing.assert_array_equal(mean, x.astype(np.float64).mean(axis=0).astype(np.float32))
    assert stores.read_kvfile(tmp_path / "mean.bin")[0][0] == b"mean"


def test_the_splits_are_kdatas(tmp_path: Path) -> None:
    write_dataset("digits", tmp_path / "t.bin", split="test", encoding="float", seed=5,
                  test_fraction=0.3, val_fraction=0.1)
    ds = load_dataset("digits", test_fraction=0.3, split_seed=5, val_fraction=0.1,
                      normalize=False, dtype=np.float64)
    np.testing.assert_array_equal(stores.read_records(tmp_path / "t.bin").y, ds.y_test)


def test_caffe_binaryproto_mean(tmp_path: Path) -> None:
    blob = CaffeBlob(num=1, channels=1, height=1, width=3, data=[1.0, 2.0, 3.5])
    (tmp_path / "mean.binaryproto").write_bytes(blob.SerializeToString())
    np.testing.assert_array_equal(stores.read_mean(tmp_path / "mean.binaryproto", "shard"),
                                  [1.0, 2.0, 3.5])


@pytest.mark.parametrize(("shape", "expected"), [
    ((8, 8), (8, 8)), ((28, 28), (28, 28)), ((3, 32, 32), (3, 32, 32)), ((784,), (784,)),
    ((64,), (64,)), ((4, 16), (4, 16)),
])
def test_resample_shapes(shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).random((5, 8, 8))
    out = resample(x, shape)
    assert out.shape == (5, *expected)
    if shape == (8, 8):
        assert out is x
    if shape == (3, 32, 32):
        np.testing.assert_array_equal(out[:, 0], out[:, 2])  # grey in every channel


def test_bilinear_resampling_keeps_constants_and_ramps() -> None:
    const = np.full((1, 3, 5), 7.0)
    np.testing.assert_allclose(resample(const, (9, 2)), 7.0)
    ramp = np.tile(np.arange(4.0), (1, 4, 1))  # along the width: 0 1 2 3
    up = resample(ramp, (4, 8))[0, 0]
    np.testing.assert_allclose(up, [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3])


@pytest.mark.parametrize(("argv", "message"), [
    (["--format", "csv", "--shape", "2,2,2,2"], "--shape 2,2,2,2: samples of shape 8,8 are "
                                                "not images"),
    (["--shape", "5,4,4"], "the images have"),
    (["--shape", "0,4"], "every dimension must be at least 1"),
    (["--scale", "100"], "pixel values must be 0..255, these are 0..1600"),
    (["--split", "val"], "the val split of digits is empty"),
    (["--scale", "nan", "--encoding", "float"], "--scale nan: the values' factor must be a "
                                                "finite number above 0"),
    (["--scale", "inf", "--encoding", "float"], "--scale inf: the values' factor must be"),
    (["--scale", "0"], "--scale 0: the values' factor must be a finite number above 0"),
    (["--seed", "-1"], "--seed -1: the seed of the split must be at least 0"),
    (["--test-fraction", "nan"], "test_fraction must be in [0, 1), got nan"),
])
def test_data_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            argv: list[str], message: str) -> None:
    x = np.zeros((4, 3, 4, 4)) if "5,4,4" in argv else None
    source = "digits"
    if x is not None:
        np.savez(tmp_path / "c.npz", x=x, y=np.zeros(4, int))
        source = str(tmp_path / "c.npz")
    code, _, err = run(capsys, "data", source, str(tmp_path / "o.bin"), *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "o.bin").exists()
