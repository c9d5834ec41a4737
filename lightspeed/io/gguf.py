"""Reading GGUF files: metadata, memory-mapped tensors, tokenizer vocabulary, chat template.

    gf = load_gguf("model.gguf")
    gf.architecture                      # "llama"
    gf.metadata["llama.block_count"]     # plain Python values: int, float, bool, str, list
    gf.arch("embedding_length")          # the same as metadata["<architecture>.embedding_length"]
    t = gf.tensors["blk.0.attn_q.weight"]
    t.shape, t.qtype                     # numpy (row-major) order, e.g. (576, 576), QType.Q4_1
    t.raw                                # uint8 view of the mapped file: (576, 360) for 576 rows of
                                         # 576 values in 18 Q4_1 blocks of 20 bytes; no copy
    t.dequantize()                       # float32 (576, 576)
    gf.tokenizer_info()                  # tokens, merges, token types, special ids (GGUFTokenizerInfo)
    gf.chat_template                     # the Jinja2 template string, or None

GGUF stores dimensions innermost first (``ne[0]`` = number of columns); ``shape`` here is
reversed into numpy order, so a weight ``[out_features, in_features]`` reads as rows of
``in_features`` values, and each row of ``raw`` holds whole quantization blocks.

The header is parsed here rather than with ``gguf.GGUFReader``: that reader loops
forever on a corrupted array length (reads past the end return empty arrays) and takes
about 3 s on the 98 MB default model, where this parser takes a fraction of a second.
Every length, count, offset and type id is checked against the file before it is used,
and any problem raises ``ModelFormatError`` naming the file and the field; the tests
use ``gguf.GGUFReader`` as an independent oracle on valid files.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..memory import release_file_pages
from ..quant import QType, block_format, dequantize, type_size
from ..quant.formats import FORMATS
from .errors import ModelFormatError
from .files import open_regular

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4            # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8   # arrays of arrays are legal but never deep in practice
# the tokenizer.ggml.model values llama.cpp defines (gguf_vocab.py builds gpt2 and llama)
KNOWN_TOKENIZER_MODELS = ("gpt2", "llama", "bert", "t5", "rwkv", "ugm", "plamo2", "no", "none")

# GGUF metadata value types: id -> (name, numpy dtype or None for string/array)
_VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("uint8", "<u1"), 1: ("int8", "<i1"), 2: ("uint16", "<u2"), 3: ("int16", "<i2"), 4: ("uint32", "<u4"),
    5: ("int32", "<i4"), 6: ("float32", "<f4"), 7: ("bool", "<u1"), 8: ("string", None), 9: ("array", None),
    10: ("uint64", "<u8"), 11: ("int64", "<i8"), 12: ("float64", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7
# tensor types stored as plain elements: numpy dtype of the view, Lightspeed dtype
_PLAIN_TYPES = {QType.F32: ("<f4", dt.float32), QType.F16: ("<f2", dt.float16), QType.BF16: ("<u2", dt.bfloat16),
                QType.I8: ("i1", dt.int8), QType.I16: ("<i2", dt.int16), QType.I32: ("<i4", dt.int32),
                QType.I64: ("<i8", dt.int64)}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Cursor:
    """Bounds-checked reads from the mapped file; every failure names the path and the field."""

    def __init__(self, buf: mmap.mmap, size: int, path: str):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, problem: str) -> ModelFormatError:
        return ModelFormatError(self.path, problem)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {what} at offset {self.pos} needs {n} bytes but only "
                            f"{self.size - self.pos} remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what} at offset {start} claims {n} bytes but only {self.size - self.pos} remain")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} at offset {start} is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def _strings(self, count: int, what: str) -> list[str]:
        """An array of strings: the vocabulary of a model has ~10^5 of them, so this loop is kept tight."""
        buf, size, pos, unpack = self.buf, self.size, self.pos, _U64.unpack_from
        out = []
        try:
            for i in range(count):
                if size - pos < 8:
                    break
                (n,) = unpack(buf, pos)
                if n > size - pos - 8:
                    break
                out.append(buf[pos + 8:pos + 8 + n].decode("utf-8"))
                pos += 8 + n
        except UnicodeDecodeError as e:
            raise self.fail(f"item {i} of {what} at offset {pos} is not valid UTF-8 ({e.reason})") from None
        if len(out) < count:
            raise self.fail(f"truncated: item {len(out)} of {what} at offset {pos} runs past the end of the file")
        self.pos = pos
        return out

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        """One metadata value of GGUF type ``vtype``, as a plain Python value."""
        if vtype not in _VALUE_TYPES:
            raise self.fail(f"{what} has unknown value type {vtype}")
        name, np_type = _VALUE_TYPES[vtype]
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise self.fail(f"{what} nests arrays more than {MAX_ARRAY_NESTING} deep")
            item_type = self.u32(f"item type of {what}")
            count = self.u64(f"length of {what}")
            if item_type not in _VALUE_TYPES:
                raise self.fail(f"{what} has items of unknown value type {item_type}")
            item_dt = _VALUE_TYPES[item_type][1]
            min_item = np.dtype(item_dt).itemsize if item_dt else (8 if item_type == _STRING else 12)
            if count > (self.size - self.pos) // min_item:
                raise self.fail(f"{what} claims {count} items of {_VALUE_TYPES[item_type][0]} but only "
                                f"{self.size - self.pos} bytes remain")
            if item_type == _STRING:
                return self._strings(count, what)
            if item_dt is not None:
                arr = np.frombuffer(self.buf, dtype=item_dt, count=count, offset=self.pos)
                self.pos += arr.nbytes
                return (arr != 0).tolist() if item_type == _BOOL else arr.tolist()
            return [self.value(item_type, f"item {i} of {what}", depth + 1) for i in range(count)]
        size = np.dtype(np_type).itemsize
        self.need(size, what)
        v = np.frombuffer(self.buf, dtype=np_type, count=1, offset=self.pos)[0]
        self.pos += size
        return bool(v) if vtype == _BOOL else v.item()


@dataclass(frozen=True)
class GGUFTokenizerInfo:
    """The tokenizer a GGUF file describes (keys ``tokenizer.ggml.*``)."""

    model: str                       # "gpt2" (byte-level BPE), "llama" (SentencePiece BPE), ...
    pre: str | None                  # pre-tokenizer name for gpt2 models ("smollm", "llama-bpe", ...)
    tokens: list[str]
    token_types: list[int] | None    # 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
    scores: list[float] | None
    merges: list[str] | None         # "left right" pairs, highest priority first
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None


class GGUFTensor:
    """One tensor of a GGUF file, backed by the memory-mapped file."""

    __slots__ = ("name", "qtype", "shape", "offset", "n_bytes", "_file")

    def __init__(self, name: str, qtype: QType, shape: tuple[int, ...], offset: int, n_bytes: int, file: "GGUFFile"):
        self.name, self.qtype, self.shape, self.offset, self.n_bytes, self._file = \
            name, qtype, shape, offset, n_bytes, file

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def supported(self) -> bool:
        """Whether Lightspeed can decode this tensor type (``lightspeed.quant.FORMATS``)."""
        return self.qtype in FORMATS

    @property
    def raw(self) -> np.ndarray:
        """The stored bytes as uint8 ``shape[:-1] + (row_bytes,)``: a view of the mapping, not a copy."""
        flat = np.frombuffer(self._file._map, dtype=np.uint8, count=self.n_bytes, offset=self.offset)
        if not self.shape:
            return flat
        elems, nbytes = type_size(self.qtype)
        return flat.reshape(self.shape[:-1] + (self.shape[-1] // elems * nbytes,))

    @property
    def ls_dtype(self) -> dt.DType:
        """The Lightspeed dtype of ``numpy()``: the element type for F32/F16/BF16/I8..I32 tensors,
        uint8 (the raw bytes) for quantized ones."""
        return _PLAIN_TYPES.get(self.qtype, (None, dt.uint8))[1]

    def numpy(self) -> np.ndarray:
        """The values with their own dtype and ``shape``, as a view of the mapping (no copy):
        float32/float16, BF16 as uint16 bits, int8..int32. Quantized tensors give ``raw``."""
        if self.qtype not in _PLAIN_TYPES:
            return self.raw
        np_type = np.dtype(_PLAIN_TYPES[self.qtype][0])
        flat = np.frombuffer(self._file._map, dtype=np_type, count=self.n_bytes // np_type.itemsize,
                             offset=self.offset)
        return flat.reshape(self.shape)

    def dequantize(self) -> np.ndarray:
        """The values as a float32 array of ``shape`` (a new array)."""
        block_format(self.qtype)  # a clear error for types we cannot decode
        return dequantize(self.raw, self.qtype, self.shape)

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.qtype.name}, shape={self.shape})"


class GGUFFile:
    """A parsed GGUF file: ``metadata`` (dict), ``tensors`` (name -> GGUFTensor, file order)."""

    def __init__(self, path: str, version: int, metadata: dict[str, Any], tensors: dict[str, GGUFTensor],
                 alignment: int, data_offset: int, mapping: mmap.mmap):
        self.path, self.version, self.metadata, self.tensors = path, version, metadata, tensors
        self.alignment, self.data_offset, self._map = alignment, data_offset, mapping
        self._vocabulary_released = False

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` ("llama", "gemma2", "bert", ...), or None if the file has none."""
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None

    def require(self, key: str) -> Any:
        """``metadata[key]``, or ModelFormatError naming the missing key."""
        if key not in self.metadata:
            raise ModelFormatError(self.path, f"missing metadata key {key!r}")
        return self.metadata[key]

    _MISSING = object()

    def arch(self, name: str, default: Any = _MISSING) -> Any:
        """The architecture-scoped key ``<architecture>.<name>`` (e.g. ``arch("block_count")``)."""
        key = f"{self.architecture}.{name}"
        if default is not GGUFFile._MISSING and key not in self.metadata:
            return default
        return self.require(key)

    @property
    def chat_template(self) -> str | None:
        t = self.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None

    def tokenizer_info(self) -> GGUFTokenizerInfo:
        """The vocabulary and special tokens; ModelFormatError if they are missing or inconsistent."""
        if self._vocabulary_released:
            raise ValueError(f"{self.path}: the vocabulary was released after the tokenizer was built; "
                             "load the file again (load_gguf) to read it")
        md = self.metadata

        def typed(key: str, kind, default=None):
            v = md.get(key, default)
            if v is not None and not (isinstance(v, kind) or (kind is list and isinstance(v, list))):
                raise ModelFormatError(self.path, f"metadata {key!r} should be {kind.__name__}, got "
                                                  f"{type(v).__name__}")
            return v

        tokens = typed("tokenizer.ggml.tokens", list)
        model = typed("tokenizer.ggml.model", str)
        if model is None or tokens is None:
            raise ModelFormatError(self.path, "no tokenizer: tokenizer.ggml.model / tokenizer.ggml.tokens missing")
        if model not in KNOWN_TOKENIZER_MODELS:
            raise ModelFormatError(self.path, f"tokenizer.ggml.model is {model[:64]!r}, not a GGUF tokenizer model "
                                              f"(known: {', '.join(KNOWN_TOKENIZER_MODELS)})")
        if not all(isinstance(t, str) for t in tokens):
            raise ModelFormatError(self.path, "tokenizer.ggml.tokens must be an array of strings")
        n = len(tokens)
        for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            v = typed(key, list)
            if v is not None and len(v) != n:
                raise ModelFormatError(self.path, f"{key} has {len(v)} entries for {n} tokens")
        merges = typed("tokenizer.ggml.merges", list)
        if merges is not None and not all(isinstance(m, str) for m in merges):
            raise ModelFormatError(self.path, "tokenizer.ggml.merges must be an array of strings")
        ids = {}
        for short, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
                           ("unk", "unknown_token_id")):
            v = typed(f"tokenizer.ggml.{key}", int)
            if v is not None and not 0 <= v < n:
                raise ModelFormatError(self.path, f"tokenizer.ggml.{key} = {v} is outside the vocabulary of {n}")
            ids[short] = v
        return GGUFTokenizerInfo(
            model=model, pre=typed("tokenizer.ggml.pre", str), tokens=tokens,
            token_types=typed("tokenizer.ggml.token_type", list), scores=typed("tokenizer.ggml.scores", list),
            merges=merges, bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"], unk_id=ids["unk"],
            add_bos=bool(typed("tokenizer.ggml.add_bos_token", bool, model == "llama")),
            add_eos=bool(typed("tokenizer.ggml.add_eos_token", bool, False)),
            add_space_prefix=bool(typed("tokenizer.ggml.add_space_prefix", bool, model == "llama")),
            chat_template=self.chat_template)

    VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                       "tokenizer.ggml.scores")

    def release_vocabulary(self) -> None:
        """Drop the vocabulary arrays from ``metadata`` once a tokenizer has been built from them (~100,000
        Python strings for a 49k vocabulary, ~16 MB); ``tokenizer_info`` needs a fresh ``load_gguf`` after."""
        for key in self.VOCABULARY_KEYS:
            self.metadata.pop(key, None)
        self._vocabulary_released = True

    def close(self) -> None:
        """Release the mapping (it stays open while arrays from ``raw`` are still alive)."""
        try:
            self._map.close()
        except BufferError:
            pass  # views are still in use; the mapping closes when they are gone

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, {self.architecture}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"


def _open_map(path: str) -> tuple[mmap.mmap, int]:
    with open_regular(path) as f:  # a FIFO or a directory is refused, never waited on
        try:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ModelFormatError(path, "the file is empty")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size
        except OSError as e:
            raise ModelFormatError(path, f"cannot map: {e.strerror or e}") from None


def load_gguf(path: "str | os.PathLike[str]") -> GGUFFile:
    """Parse and validate a GGUF file; tensors stay in the memory-mapped file."""
    path = os.fspath(path)
    buf, size = _open_map(path)
    try:
        return _parse(_Cursor(buf, size, path), buf)
    except ModelFormatError:
        buf.close()
        raise


def _parse(c: _Cursor, buf: mmap.mmap) -> GGUFFile:
    if c.size < 4 or buf[0:4] != GGUF_MAGIC:
        raise c.fail(f"not a GGUF file (starts with {bytes(buf[0:4])!r}, expected {GGUF_MAGIC!r})")
    c.pos = 4
    version = c.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
        raise c.fail(f"unsupported GGUF version {version}{hint}; supported: {SUPPORTED_VERSIONS}")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata count")
    # each key/value takes at least 13 bytes and each tensor header at least 24: reject absurd counts
    if n_kv * 13 + n_tensors * 24 > c.size - c.pos:
        raise c.fail(f"header claims {n_kv} metadata entries and {n_tensors} tensors, which cannot fit in "
                     f"{c.size} bytes")
    metadata: dict[str, Any] = {}
    types: dict[str, int] = {}
    for i in range(n_kv):
        key = c.string(f"key of metadata entry {i}")
        vtype = c.u32(f"value type of {key!r}")
        if key in metadata:
            raise c.fail(f"duplicate metadata key {key!r}")
        metadata[key] = c.value(vtype, f"metadata {key!r}")
        types[key] = vtype
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and (types["general.alignment"] != 4 or alignment == 0
                                            or alignment & (alignment - 1)):
        raise c.fail(f"general.alignment must be a uint32 power of two, got {alignment!r}")
    infos = [_tensor_info(c, i) for i in range(n_tensors)]
    data_offset = -(-c.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    file = GGUFFile(c.path, version, metadata, tensors, alignment, data_offset, buf)
    spans = []
    for name, dims, qtype, rel in infos:
        if name in tensors:
            raise c.fail(f"duplicate tensor name {name!r}")
        if rel % alignment:
            raise c.fail(f"tensor {name!r} has offset {rel}, not a multiple of the alignment {alignment}")
        elems, block_bytes = type_size(qtype)
        if dims and dims[0] % elems:
            raise c.fail(f"tensor {name!r} has rows of {dims[0]} values, not a multiple of the {qtype.name} "
                         f"block size {elems}")
        n = int(np.prod(dims, dtype=object)) if dims else 1
        n_bytes = n // elems * block_bytes
        start = data_offset + rel
        if start + n_bytes > c.size:
            raise c.fail(f"tensor {name!r} data [{start}, {start + n_bytes}) lies beyond the end of the file "
                         f"({c.size} bytes; truncated?)")
        spans.append((start, start + n_bytes, name))
        tensors[name] = GGUFTensor(name, qtype, tuple(reversed(dims)), start, n_bytes, file)
    spans.sort()
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise c.fail(f"tensors {a!r} and {b!r} overlap in the file (corrupt offsets)")
    # the header is parsed into Python values: its pages (the vocabulary's strings, ~2 MB for SmolLM2) need not
    # stay resident in this process for as long as the weights are mapped
    release_file_pages([np.frombuffer(buf, dtype=np.uint8, count=min(data_offset, c.size))])
    return file


def _tensor_info(c: _Cursor, i: int) -> tuple[str, list[int], QType, int]:
    name = c.string(f"name of tensor {i}")
    n_dims = c.u32(f"dimension count of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise c.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
    dims = [c.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
    if any(d >= 1 << 62 for d in dims) or int(np.prod(dims, dtype=object) if dims else 1) >= 1 << 62:
        raise c.fail(f"tensor {name!r} has impossible dimensions {dims}")
    type_id = c.u32(f"type of tensor {name!r}")
    try:
        qtype = QType(type_id)
    except ValueError:
        raise c.fail(f"tensor {name!r} has unknown type id {type_id}") from None
    offset = c.u64(f"data offset of tensor {name!r}")
    return name, dims, qtype, offset
