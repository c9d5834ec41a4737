"""The ``lightspeed perplexity`` subcommand (registered in ``cli.py``): the perplexity of a text file under a
model, e.g. to compare ``--activations`` modes or check a requantized file."""
from __future__ import annotations

import argparse
import json
import time

from .cli_generate import (activation_options, add_activations_argument, add_kv_cache_argument, kv_cache_name,
                           kv_cache_options, read_stdin_text)


def _perplexity(args: argparse.Namespace) -> int:
    from .api import load
    from .perplexity import perplexity
    if args.file == "-":
        text = read_stdin_text()
    else:
        try:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"perplexity: cannot read the text file {args.file!r}: {e}") from None
    if args.window < 2:
        raise ValueError(f"--window must be at least 2, got {args.window}")
    # errors are reported by lightspeed.cli.run_handler
    model = load(args.model, ctx=args.window, progress=False, last_only=False, max_chunk=args.chunk,
                 **activation_options(args.activations), **kv_cache_options(args.kv_cache))
    ids = model.tokenizer.encode(text)
    t0 = time.perf_counter()
    result = perplexity(model.step, ids, window=args.window)
    report = {"model": model.path, "file": args.file, "activations": args.activations,
              "kv_cache": kv_cache_name(args.kv_cache), "window": args.window,
              **result.as_dict(), "seconds": round(time.perf_counter() - t0, 3)}
    print(json.dumps(report) if args.json else
          f"perplexity {result.perplexity:.4f} over {result.tokens} tokens (mean NLL {result.mean_nll:.6f} nats, "
          f"windows of {args.window}, activations {args.activations}, {kv_cache_name(args.kv_cache)} KV cache)")
    return 0


def add_perplexity(sub) -> None:
    p = sub.add_parser("perplexity", help="the perplexity of a text file under a model")
    p.add_argument("file", metavar="FILE", help='a UTF-8 text file ("-" reads stdin)')
    p.add_argument("--model", default=None, metavar="PATH", help="a GGUF file or model folder (default: SmolLM2)")
    p.add_argument("--window", type=int, default=1024,
                   help="tokens per window; each window starts from an empty cache (default: 1024)")
    p.add_argument("--chunk", type=int, default=64, help="tokens per call of the compiled program (default: 64)")
    add_activations_argument(p)
    add_kv_cache_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_perplexity)
