"""The ``lightspeed`` command line.

Each subcommand is one ``add_<name>(subparsers)`` function that defines its arguments and sets
``handler``; register it by adding the function to ``COMMANDS``. A handler takes the parsed
arguments and returns the process exit code; it raises for errors, and ``run_handler`` reports
them in one style: ``lightspeed: error: MESSAGE`` on stderr and exit code 1 (130 after Ctrl-C),
with the traceback only under ``--debug`` or ``LIGHTSPEED_DEBUG=1``.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Sequence

DEBUG_ENV = "LIGHTSPEED_DEBUG"


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


from .cli_compile import add_compile  # noqa: E402
from .cli_embed import add_embed  # noqa: E402
from .cli_generate import add_chat, add_generate  # noqa: E402
from .cli_perplexity import add_perplexity  # noqa: E402
from .bench.cli import add_bench  # noqa: E402
from .requant.cli import add_quantize  # noqa: E402
from .serve.cli import add_serve  # noqa: E402

COMMANDS: list[Callable] = [add_demo, add_version, add_generate, add_chat, add_embed, add_bench, add_quantize,
                            add_serve, add_perplexity, add_compile]


DEBUG_HELP = f"show the traceback of an error (also: {DEBUG_ENV}=1)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightspeed", description="Lightspeed: an ahead-of-time inference compiler")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    for p in sub.choices.values():  # also after the command; SUPPRESS keeps a --debug given before it
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def debug_requested(args: argparse.Namespace) -> bool:
    """``--debug`` was given, or ``LIGHTSPEED_DEBUG`` is set (to anything but 0)."""
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "0") not in ("", "0")


def _is_own(e: BaseException) -> bool:
    """An error class of this package (ModelFormatError, CompilerError, ContextFullError, ...)."""
    return type(e).__module__.split(".")[0] == __name__.split(".")[0]


def error_message(e: Exception) -> str:
    """The one-line message of an error; unexpected ones (bugs) are named as such, with the way to see more."""
    if isinstance(e, MemoryError):
        detail = f" ({e})" if str(e) else ""
        return f"out of memory{detail}; try a smaller --ctx or --max-batch, or a quantized model (--quant q4_0)"
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename is not None else ""
        return f"{where}{e.strerror}"
    if isinstance(e, ImportError) and not (e.name or "").startswith(__name__.split(".")[0]):
        return str(e)  # an optional dependency that is not installed
    if isinstance(e, (ValueError, OSError, NotImplementedError)) or _is_own(e):
        return str(e) or type(e).__name__
    return (f"internal error: {type(e).__name__}: {e} (run with --debug or {DEBUG_ENV}=1 for the traceback, "
            "and please report it)")


def run_handler(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace, debug: bool) -> int:
    """``handler(args)``'s exit code; an error is reported on stderr in the one style (see the module docstring)."""
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("\nlightspeed: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # whoever read stdout went away (`| head`): nothing more can be said there
        try:
            sys.stdout = open(os.devnull, "w")  # so the interpreter's final flush does not fail again
        except OSError:
            pass
        return 1
    except Exception as e:  # noqa: BLE001 - the one place that turns every error into a message
        if debug:
            traceback.print_exc()
        print(f"lightspeed: error: {error_message(e)}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightspeed`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return run_handler(args.handler, args, debug_requested(args))


if __name__ == "__main__":
    sys.exit(main())
