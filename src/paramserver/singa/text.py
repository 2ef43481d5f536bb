"""Text data for SINGA's char-rnn and rnnlm examples, written by ``paramserver data``.

Sources: ``pydoc`` — the help topics that every Python installation carries
(``pydoc_data.topics``, about 465,000 characters of English prose and code, a stand-in for
the Linux source of char-rnn and the Penn Treebank text of rnnlm that needs no download) —
or the path of a UTF-8 text file. A text is split by lines: the first lines are the
training split, then validation, then test (``--test-fraction``, ``--val-fraction``).

* ``--format text`` (kCharRNN): the split's text as it is, and with ``--vocab`` SINGA's
  vocabulary file (its characters in id order, as one string). ``--vocab-size N`` keeps the
  ``N`` most frequent characters of the training split and drops the others from the text.
* ``--format words`` (the rnnlm example's data layer): a kvfile of SINGA's rnnlm
  ``WordRecord``s, one per word, as its ``create_data`` wrote them: words are whitespace
  separated, the end of a line is the word ``</s>`` (index 0); the vocabulary is that of the
  training split, by frequency (``--vocab-size N`` keeps the ``N - 1`` most frequent and
  maps the rest to ``<unk>``; words of other splits that are not in it too); the words are
  put in ``--classes`` classes by their cumulative frequency (rnnlm's "old classes"), each
  record holding its class and the class's range of word indexes. Keys are ``%05d``.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..config import ParamError
from ..paths import read_regular, shown
from . import stores
from .files import write_atomically

PYDOC = "pydoc"
END = "</s>"
UNKNOWN = "<unk>"


def load_text(source: str) -> str:
    """The text of ``source``: ``pydoc`` or a file."""
    if source == PYDOC:
        from pydoc_data.topics import topics

        return "\n".join(topics[k] for k in sorted(topics)) + "\n"
    data = read_regular(source, "text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParamError(f"text file {shown(source)} is not UTF-8 text ({e.reason})") from None


def split_lines(text: str, split: str, test_fraction: float, val_fraction: float) -> str:
    """The lines of ``split`` (``train``, ``val``, ``test`` or ``all``), in order."""
    lines = text.splitlines(keepends=True)
    n = len(lines)
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    n_train = n - n_test - n_val
    if n_train < 1:
        raise ParamError(f"test_fraction {test_fraction:g} and val_fraction {val_fraction:g} "
                         f"leave no training lines of {n}")
    parts = {"all": lines, "train": lines[:n_train], "val": lines[n_train:n_train + n_val],
             "test": lines[n_train + n_val:]}
    return "".join(parts[split])


@dataclass(frozen=True)
class TextWritten:
    path: Path
    count: int
    vocab: int
    vocab_path: Path | None


def write_chars(text: str, train: str, output: str | os.PathLike[str],
                vocab_path: str | os.PathLike[str] | None, vocab_size: int | None
                ) -> TextWritten:
    """The text for kCharRNN and (optionally) its vocabulary file."""
    counts = Counter(train)
    ranked = sorted(counts, key=lambda c: (-counts[c], c))
    keep = set(ranked[:vocab_size] if vocab_size else ranked)
    kept = "".join(c for c in text if c in keep)
    if not kept:
        raise ParamError("no text to write (the split is empty)")
    out = write_atomically(output, kept.encode("utf-8"))
    vpath = None
    if vocab_path is not None:
        vocab = "".join(sorted(keep))
        vpath = write_atomically(vocab_path, vocab.encode("utf-8"))
    return TextWritten(out, len(kept), len(keep), vpath)


def words_of(text: str) -> list[str]:
    """Whitespace-separated words, the end of each line the word ``</s>``."""
    out: list[str] = []
    for line in text.splitlines():
        out += line.split()
        out.append(END)
    return out


def vocabulary(train: str, vocab_size: int | None) -> list[str]:
    """The words by frequency in the training split, ``</s>`` first (rnnlm's order)."""
    counts = Counter(words_of(train))
    counts.pop(END, None)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    if vocab_size is not None:
        if vocab_size < 2:
            raise ParamError("--vocab-size must be at least 2 (</s> and one word)")
        if len(ranked) > vocab_size - 1:
            ranked = [*ranked[:vocab_size - 2], UNKNOWN]
    return [END, *ranked]


def classes(words: list[str], counts: Counter[str], nclass: int) -> list[int]:
    """rnnlm's "old classes": word ``i`` is in the class its cumulative share of the word
    count reaches (each class about ``1/nclass`` of the words)."""
    total = sum(counts[w] for w in words) or 1
    out, share, a = [], 0.0, 0
    for w in words:
        share = min(share + counts[w] / total, 1.0)
        out.append(a)
        if share > (a + 1) / nclass and a < nclass - 1:
            a += 1
    return out


def write_words(text: str, train: str, output: str | os.PathLike[str], nclass: int,
                vocab_size: int | None, shard: bool = False) -> TextWritten:
    """A kvfile of rnnlm's WordRecords for the words of ``text`` (v0.2.0); ``shard``: a
    DataShard folder of Records holding them (v0.1.0's ``create_shard``)."""
    from .records import WordRecord, wrapped_word

    if nclass < 1:
        raise ParamError("--classes must be at least 1")
    vocab = vocabulary(train, vocab_size)
    counts = Counter(words_of(train))
    if UNKNOWN in vocab:
        known = set(vocab)
        counts[UNKNOWN] += sum(c for w, c in counts.items() if w not in known)
    of = classes(vocab, counts, nclass)
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for i, c in enumerate(of):
        start.setdefault(c, i)
        end[c] = i + 1
    index = {w: i for i, w in enumerate(vocab)}
    records: list[tuple[str, bytes]] = []
    unknown = index.get(UNKNOWN)
    for w in words_of(text):
        found = index.get(w, unknown)
        if found is None:
            continue  # not in the vocabulary (rnnlm's create_data leaves it out too)
        i = found
        c = of[i]
        r = WordRecord(word=vocab[i], word_index=i, class_index=c, class_start=start[c],
                       class_end=end[c])
        records.append((f"{len(records):05d}", wrapped_word(r) if shard
                        else r.SerializeToString()))
    if not records:
        raise ParamError("no words to write (the split is empty)")
    out = stores.write_kvfile(Path(output) / stores.SHARD_FILE if shard else output, records)
    return TextWritten(out, len(records), len(vocab), None)


__all__ = ["END", "PYDOC", "UNKNOWN", "TextWritten", "classes", "load_text", "split_lines",
           "vocabulary", "words_of", "write_chars", "write_words"]
