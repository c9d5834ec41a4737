"""safetensors loading (checked against the safetensors package) and Hugging Face model folders."""
import json
import struct
import time

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.io import ModelFormatError, load_model_folder, load_safetensors

st_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors package writes the test files")
from safetensors import safe_open  # noqa: E402


def _tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.f16": rng.standard_normal((4, 2)).astype(np.float16),
        "ids.i32": rng.integers(-100, 100, (7,)).astype(np.int32),
        "bytes.u8": rng.integers(0, 256, (2, 3, 4)).astype(np.uint8),
        "mask.bool": rng.random(5) < 0.5,
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }


def test_values_match_safetensors_package(tmp_path):
    p = tmp_path / "a.safetensors"
    st_numpy.save_file(_tensors(), str(p), metadata={"format": "np", "note": "ü"})
    f = load_safetensors(p)
    assert f.metadata == {"format": "np", "note": "ü"}
    with safe_open(str(p), "numpy") as ref:
        assert sorted(f.tensors) == sorted(ref.keys())
        for name in ref.keys():
            want = ref.get_tensor(name)
            got = f.tensors[name].numpy()
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), name
    view = f.tensors["w.f32"].numpy()
    assert not view.flags.owndata and not view.flags.writeable   # mapped, not copied
    assert f.tensors["w.f16"].ls_dtype is ls.float16 and f.tensors["w.f16"].dtype == "F16"
    assert f.tensors["w.f16"].to_float32().dtype == np.float32


def test_bf16_is_uint16_bits(tmp_path):
    torch = pytest.importorskip("torch")
    import safetensors.torch as st_torch
    x = torch.randn(4, 6).to(torch.bfloat16)
    p = tmp_path / "bf16.safetensors"
    st_torch.save_file({"x": x}, str(p))
    t = load_safetensors(p).tensors["x"]
    assert t.dtype == "BF16" and t.ls_dtype is ls.bfloat16
    bits = t.numpy()
    assert bits.dtype == np.uint16
    assert np.array_equal(bits, x.view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(t.to_float32(), x.float().numpy())


def _valid_file(tmp_path) -> bytes:
    p = tmp_path / "valid.safetensors"
    st_numpy.save_file({"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int32)}, str(p))
    return p.read_bytes()


def _with_header(header, data: bytes = b"\0" * 68) -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(raw)) + raw + data


def _corruptions(valid: bytes) -> dict[str, bytes]:
    (n,) = struct.unpack_from("<Q", valid, 0)
    header = json.loads(valid[8:8 + n])
    data = valid[8 + n:]

    def edit(name, **change):
        h = json.loads(json.dumps(header))
        h[name].update(change)
        return _with_header(h, data)

    cases = {
        "empty": b"",
        "four_bytes": valid[:4],
        "header_len_huge": struct.pack("<Q", 1 << 62) + valid[8:],
        "header_len_past_eof": struct.pack("<Q", len(valid)) + valid[8:],
        "header_len_short": struct.pack("<Q", n - 3) + valid[8:],
        "bad_json": _with_header(b"{not json", data),
        "bad_utf8": _with_header(b'{"a": "\xff"}', data),
        "json_list": _with_header([1, 2], data),
        "deep_json": _with_header(b"[" * 100000 + b"]" * 100000, data),
        "entry_not_object": _with_header({"a": 5}, data),
        "missing_offsets": _with_header({"a": {"dtype": "F32", "shape": [1]}}, data),
        "dtype_unknown": edit("a", dtype="F8_E4M3"),
        "dtype_nonsense": edit("a", dtype=7),
        "shape_negative": edit("a", shape=[-3, 4]),
        "shape_float": edit("a", shape=[3.0, 4]),
        "shape_too_big": edit("a", shape=[3, 5]),
        "offsets_out_of_range": edit("a", data_offsets=[0, 10 ** 12]),
        "offsets_reversed": edit("a", data_offsets=[48, 0]),
        "offsets_negative": edit("a", data_offsets=[-4, 44]),
        "offsets_three": edit("a", data_offsets=[0, 24, 48]),
        "offsets_overlap": edit("b", data_offsets=[0, 20]),
        "metadata_not_strings": _with_header({"__metadata__": {"k": 1}, **header}, data),
        "truncated_data": valid[:len(valid) - 10],
    }
    rng = np.random.default_rng(99)
    for k, cut in enumerate(sorted(rng.integers(1, len(valid), 20).tolist())):
        cases[f"truncate_{k}_at_{cut}"] = valid[:cut]
    return cases


def test_corrupted_files_fail_cleanly(tmp_path):
    valid = _valid_file(tmp_path)
    for name, data in _corruptions(valid).items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(data)
        t0 = time.perf_counter()
        with pytest.raises(ModelFormatError) as e:
            f = load_safetensors(p)
            for t in f.tensors.values():
                t.numpy()
        assert e.value.path == str(p), name
        assert time.perf_counter() - t0 < 2.0, name
    # and a few messages say what is wrong
    for name, text in (("dtype_unknown", "unknown or unsupported dtype 'F8_E4M3'"), ("bad_json", "not valid JSON"),
                       ("offsets_overlap", "overlap"), ("header_len_past_eof", "exceeds the file size"),
                       ("shape_too_big", "needs 60 bytes")):
        with pytest.raises(ModelFormatError, match=text.replace("(", r"\(")):
            load_safetensors(tmp_path / f"{name}.safetensors")


# -- model folders --------------------------------------------------------------------------------

def _write_folder(folder, sharded: bool = True):
    folder.mkdir(exist_ok=True)
    tensors = _tensors(3)
    names = sorted(tensors)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>", "add_bos_token": True,
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    if sharded:
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for shard, keys in shards.items():
            st_numpy.save_file({k: tensors[k] for k in keys}, str(folder / shard))
        index = {"metadata": {}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        st_numpy.save_file(tensors, str(folder / "model.safetensors"))
    return tensors


@pytest.mark.parametrize("sharded", [True, False])
def test_model_folder(tmp_path, sharded):
    tensors = _write_folder(tmp_path / "m", sharded)
    mf = load_model_folder(tmp_path / "m")
    assert mf.config["hidden_size"] == 8 and mf.generation_config["eos_token_id"] == [2, 3]
    assert sorted(mf.tensors) == sorted(tensors)
    for k, v in tensors.items():
        assert np.array_equal(mf.tensors[k].numpy(), v)
    assert mf.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    assert mf.chat_template.startswith("{% for m in messages %}")
    assert mf.tokenizer_json is None
    assert len(mf.files) == (2 if sharded else 1)


def test_model_folder_template_file_wins(tmp_path):
    _write_folder(tmp_path / "m", sharded=False)
    (tmp_path / "m" / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert load_model_folder(tmp_path / "m").chat_template == "{{ messages[0]['content'] }}"


def test_model_folder_errors(tmp_path):
    m = tmp_path / "m"
    _write_folder(m)
    index = json.loads((m / "model.safetensors.index.json").read_text())
    with pytest.raises(ModelFormatError, match="not a directory"):
        load_model_folder(m / "config.json")
    (m / "config.json").write_text("{oops")
    with pytest.raises(ModelFormatError, match="config.json: not valid JSON"):
        load_model_folder(m)
    (m / "config.json").write_text("{}")
    bad = dict(index, weight_map=dict(index["weight_map"], extra="model-00003-of-00003.safetensors"))
    (m / "model.safetensors.index.json").write_text(json.dumps(bad))
    with pytest.raises(ModelFormatError, match="shard 'model-00003-of-00003.safetensors' is missing"):
        load_model_folder(m)
    moved = dict(index["weight_map"])
    first = sorted(moved)[0]
    moved[first] = "model-00002-of-00002.safetensors"
    (m / "model.safetensors.index.json").write_text(json.dumps(dict(index, weight_map=moved)))
    with pytest.raises(ModelFormatError, match=f"tensor '{first}' is listed in"):
        load_model_folder(m)
    evil = dict(index, weight_map={first: "../x.safetensors"})
    (m / "model.safetensors.index.json").write_text(json.dumps(evil))
    with pytest.raises(ModelFormatError, match="not a plain file name"):
        load_model_folder(m)
    (m / "model.safetensors.index.json").unlink()
    with pytest.raises(ModelFormatError, match="also in"):  # both shards now load, tensors must not repeat
        st_numpy.save_file({first: np.zeros(1, np.float32)}, str(m / "zz.safetensors"))
        load_model_folder(m)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ModelFormatError, match="no model.safetensors"):
        load_model_folder(empty)
