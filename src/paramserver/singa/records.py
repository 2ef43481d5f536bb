"""The protocol-buffer messages of SINGA's data and checkpoint files (``common.proto``).

The messages are declared here as descriptors (field names, numbers and types, as SINGA's
``common.proto`` has them) and built into message classes by protobuf's own runtime, so that
files are read and written byte for byte as SINGA's C++ code does, without protoc and
without hand-written wire code. Parsing a message runs no code of the file's.

* ``BlobProto`` (shape, packed float data) and ``BlobProtos`` (name, version and blob of
  each Param): SINGA's checkpoint files;
* ``RecordProto`` (shape, label, pixel bytes, packed float data), called
  ``SingleLabelImageRecord`` in v0.1.0 (same fields): one sample of a kvfile store or a mean
  file;
* ``Record`` (type kSingleLabelImage, the ``image``): v0.1.0's DataShard records;
* ``CaffeBlob`` (Caffe's ``.binaryproto`` mean images) and ``CaffeDatum`` (LMDB records):
  what SINGA imported from Caffe;
* ``WordRecord`` (word, its index, its class and the class's range of indexes): the records
  of SINGA's rnnlm example (``examples/rnnlm/rnnlm.proto``): bare in v0.2.0's kvfile, the
  ``word`` extension (101) of a ``Record`` in v0.1.0's DataShard (:func:`word_record` reads
  both).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from ..config import ParamError

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_TYPES = {"int32": _F.TYPE_INT32, "float": _F.TYPE_FLOAT, "bytes": _F.TYPE_BYTES,
          "string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL}

#: message -> fields (name, number, label, type, packed); a type that is not a scalar is the
#: name of a message or enum of the package.
_MESSAGES: dict[str, list[tuple[str, int, int, str, bool]]] = {
    "BlobProto": [("shape", 1, _REPEATED, "int32", False),
                  ("data", 2, _REPEATED, "float", True)],
    "BlobProtos": [("id", 2, _REPEATED, "int32", False),
                   ("version", 3, _REPEATED, "int32", False),
                   ("name", 4, _REPEATED, "string", False),
                   ("blob", 5, _REPEATED, "BlobProto", False)],
    "RecordProto": [("shape", 1, _REPEATED, "int32", False),
                    ("label", 2, _OPTIONAL, "int32", False),
                    ("pixel", 3, _OPTIONAL, "bytes", False),
                    ("data", 4, _REPEATED, "float", True)],
    "Record": [("type", 1, _OPTIONAL, "Record.Type", False),
               ("user_type", 2, _OPTIONAL, "string", False),
               ("image", 5, _OPTIONAL, "RecordProto", False)],
    "CaffeDatum": [("channels", 1, _OPTIONAL, "int32", False),
                   ("height", 2, _OPTIONAL, "int32", False),
                   ("width", 3, _OPTIONAL, "int32", False),
                   ("data", 4, _OPTIONAL, "bytes", False),
                   ("label", 5, _OPTIONAL, "int32", False),
                   ("float_data", 6, _REPEATED, "float", False),
                   ("encoded", 7, _OPTIONAL, "bool", False)],
    "WordRecord": [("word", 1, _OPTIONAL, "string", False),
                   ("word_index", 2, _OPTIONAL, "int32", False),
                   ("class_index", 3, _OPTIONAL, "int32", False),
                   ("class_start", 4, _OPTIONAL, "int32", False),
                   ("class_end", 5, _OPTIONAL, "int32", False)],
    "CaffeBlob": [("num", 1, _OPTIONAL, "int32", False),
                  ("channels", 2, _OPTIONAL, "int32", False),
                  ("height", 3, _OPTIONAL, "int32", False),
                  ("width", 4, _OPTIONAL, "int32", False),
                  ("data", 5, _REPEATED, "float", True),
                  ("diff", 6, _REPEATED, "float", True)],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="paramserver/singa/common.proto",
                                           package="singa", syntax="proto2")
    for name, fields in _MESSAGES.items():
        m = f.message_type.add(name=name)
        if name == "Record":
            e = m.enum_type.add(name="Type")
            e.value.add(name="kSingleLabelImage", number=0)
            m.extension_range.add(start=101, end=201)
        for fname, number, label, ftype, packed in fields:
            fd = m.field.add(name=fname, number=number, label=label)
            if ftype in _TYPES:
                fd.type = _TYPES[ftype]
            elif ftype == "Record.Type":
                fd.type, fd.type_name, fd.default_value = (_F.TYPE_ENUM, ".singa.Record.Type",
                                                           "kSingleLabelImage")
            else:
                fd.type, fd.type_name = _F.TYPE_MESSAGE, f".singa.{ftype}"
            if packed:
                fd.options.packed = True
    # rnnlm.proto of v0.1.0: extend singa.Record { optional WordRecord word = 101; }
    f.extension.add(name="word", number=101, label=_OPTIONAL, type=_F.TYPE_MESSAGE,
                    type_name=".singa.WordRecord", extendee=".singa.Record")
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message_class(name: str) -> Any:
    """The message class of ``singa.<name>`` (``"BlobProtos"``, ``"RecordProto"``, ...)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"singa.{name}"))


BlobProto = message_class("BlobProto")
BlobProtos = message_class("BlobProtos")
RecordProto = message_class("RecordProto")
#: v0.1.0's name of RecordProto.
SingleLabelImageRecord = RecordProto
Record = message_class("Record")
CaffeDatum = message_class("CaffeDatum")
CaffeBlob = message_class("CaffeBlob")
WordRecord = message_class("WordRecord")
#: The ``word`` extension of ``Record`` (v0.1.0's rnnlm shards).
WORD = _POOL.FindExtensionByName("singa.word")


def word_record(value: bytes, what: str) -> Any:
    """The WordRecord of a stored value: a bare one (v0.2.0's kvfile) or the ``word``
    extension of a Record (v0.1.0's DataShard, as its rnnlm ``create_shard`` wrote it)."""
    try:
        return parse(WordRecord, value, what)
    except ParamError:
        record = parse(Record, value, what)
        if not record.HasExtension(WORD):
            raise ParamError(f"{what}: neither a WordRecord nor a Record holding one") from None
        return record.Extensions[WORD]


def wrapped_word(word: Any) -> bytes:
    """A WordRecord as v0.1.0's rnnlm ``create_shard`` stored it: a Record's extension."""
    record = Record()
    record.Extensions[WORD].CopyFrom(word)
    return bytes(record.SerializeToString())


def parse(cls: Any, data: bytes, what: str) -> Any:
    """Parse ``data`` as a message of ``cls``; ParamError (``what`` names the file or record)
    when it is not one: undecodable, or with fields ``cls`` does not have."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ParamError(f"{what}: not a {cls.DESCRIPTOR.name} ({e})") from None
    if _has_unknown(msg):
        raise ParamError(f"{what}: not a {cls.DESCRIPTOR.name} (it holds fields that "
                         f"{cls.DESCRIPTOR.name} does not have)")
    return msg


def _has_unknown(msg: Message) -> bool:
    if len(UnknownFieldSet(msg)):
        return True
    for fd, value in msg.ListFields():
        if fd.type == _F.TYPE_MESSAGE:
            items = value if fd.is_repeated else [value]
            if any(_has_unknown(v) for v in items):
                return True
    return False


__all__ = ["WORD", "BlobProto", "BlobProtos", "CaffeBlob", "CaffeDatum", "Record", "RecordProto",
           "SingleLabelImageRecord", "WordRecord", "message_class", "parse", "word_record",
           "wrapped_word"]
