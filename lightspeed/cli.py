"""The ``lightspeed`` command line.

Each subcommand is one ``add_<name>(subparsers)`` function that defines its arguments and sets
``handler``; register it by adding the function to ``COMMANDS``. A handler takes the parsed
arguments and returns the process exit code.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence


def _demo(args: argparse.Namespace) -> int:
    from .demo import run
    return 0 if run(backend=args.backend, sizes=args.sizes, seed=args.seed) else 1


def add_demo(sub) -> None:
    p = sub.add_parser("demo", help="compile a small graph with a symbolic dim and check it against numpy")
    p.add_argument("--backend", default="auto",
                   help='backend name, or "auto": "c" where it is available, else "reference" (default: auto)')
    p.add_argument("--sizes", type=int, nargs="+", default=[3, 17], help="values of the symbolic dim to run")
    p.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    p.set_defaults(handler=_demo)


def _version(args: argparse.Namespace) -> int:
    from . import __version__
    print(f"lightspeed {__version__}")
    return 0


def add_version(sub) -> None:
    p = sub.add_parser("version", help="print the version")
    p.set_defaults(handler=_version)


from .cli_embed import add_embed  # noqa: E402
from .cli_generate import add_chat, add_generate  # noqa: E402
from .bench.cli import add_bench  # noqa: E402
from .requant.cli import add_quantize  # noqa: E402
from .serve.cli import add_serve  # noqa: E402

COMMANDS: list[Callable] = [add_demo, add_version, add_generate, add_chat, add_embed, add_bench, add_quantize, add_serve]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightspeed", description="Lightspeed: an ahead-of-time inference compiler")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightspeed`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
