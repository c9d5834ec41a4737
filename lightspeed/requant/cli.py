"""The ``lightspeed quantize`` subcommand (registered in ``lightspeed/cli.py``)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .plan import TARGETS


def _check_paths(src: str, dst: str) -> None:
    """Refuse an OUT that cannot be written as a file before anything is read."""
    if os.path.isdir(src):
        raise ValueError(f"IN {src!r} is a directory; give the GGUF file to read")
    if os.path.isdir(dst):
        raise ValueError(f"OUT {dst!r} is a directory; give the file to write, e.g. "
                         f"{os.path.join(dst, os.path.basename(src) or 'model.gguf')!r}")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise ValueError(f"OUT {dst!r}: the directory {parent!r} does not exist")


def _quantize(args: argparse.Namespace) -> int:
    from .gguf_file import quantize_gguf

    def progress(name: str, i: int, n: int) -> None:
        if not args.quiet:
            print(f"\r[{i + 1}/{n}] {name:<40}", end="", file=sys.stderr, flush=True)

    _check_paths(args.input, args.output)
    try:  # errors are reported by lightspeed.cli.run_handler
        report = quantize_gguf(args.input, args.output, args.type, progress=progress)
    finally:
        if not args.quiet:
            print(file=sys.stderr)  # ends the progress line
    summary = {"input": args.input, "output": args.output, "type": report.target, "converted": len(report.converted),
               "kept": len(report.kept), "bytes_in": report.bytes_in, "bytes_out": report.bytes_out,
               "dropped_keys": report.dropped_keys, "seconds": round(report.seconds, 3)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {args.output}: {len(report.converted)} tensors as {report.target}, {len(report.kept)} kept "
              f"({report.bytes_in / 1e6:.1f} MB -> {report.bytes_out / 1e6:.1f} MB of tensor data, "
              f"{report.seconds:.1f} s)")
    return 0


def add_quantize(sub) -> None:
    p = sub.add_parser("quantize", help="write a GGUF file with the matrices requantized (llama.cpp reads it too)")
    p.add_argument("input", metavar="IN", help="the GGUF file to read")
    p.add_argument("output", metavar="OUT", help="the GGUF file to write")
    p.add_argument("--type", required=True, type=str.lower, choices=list(TARGETS),
                   help="the block type of the matrices (vectors such as norms stay as stored)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=_quantize)
