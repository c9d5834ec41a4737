"""``run_bench``: load, (re)quantize and compile a GGUF model, then time it against the machine's
read-bandwidth limit and, optionally, against peer engines on the same file and thread count.

One benchmark run measures, in this order: the read bandwidth (probe), Lightspeed's prefill
and decode, then each peer's. Runs repeat that sequence, so on a noisy machine every engine
and the probe see the same conditions, and the report gives the median and the best run.
"""
from __future__ import annotations

import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .engines import LightspeedEngine, LlamaCppEngine, TorchEngine
from .machine import PeakRSS, available_cores, machine_summary, source_revision
from .probe import measure_read_bandwidth
from .rss import rss_breakdown

PEERS = ("llama.cpp", "pytorch", "pytorch-bf16")
PAUSE_S = 0.25  # lets the previous engine's spinning worker threads go to sleep before the next one


@dataclass
class BenchOptions:
    """What ``lightspeed bench`` measures (see ``lightspeed bench --help``)."""

    model: str | None = None        # a GGUF file; None: the default SmolLM2
    threads: int | None = None      # None: every available core
    prompt_tokens: int = 512
    decode_tokens: int = 64
    runs: int = 3
    quant: str | None = None        # requantize in memory at load (q8_0, q4_0, q4_1, f16, bf16, f32)
    peers: bool = False
    probe_reps: int = 5
    seed: int = 0
    activations: str = "float"      # Lightspeed's quantized matmuls: float, int16 or int8 (llama.cpp-style)
    kv_cache: str | None = None     # Lightspeed's KV cache element type: f16 or f32 (None: the default, f16)
    peer_names: tuple[str, ...] = PEERS


@dataclass
class Timings:
    """Seconds per run of one engine."""

    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)

    def rates(self, prompt_tokens: int, decode_tokens: int) -> dict[str, Any]:
        pre = [prompt_tokens / s for s in self.prefill_s]
        dec = [decode_tokens / s for s in self.decode_s]
        return {"decode_tokens_per_s": statistics.median(dec), "decode_tokens_per_s_best": max(dec),
                "prefill_tokens_per_s": statistics.median(pre), "prefill_tokens_per_s_best": max(pre),
                "decode_runs": dec, "prefill_runs": pre}


def weight_bytes_per_token(tensors: dict) -> int:
    """Bytes of weights one decode step reads: every tensor once, except that an embedding table
    with a separate output matrix only has one row read (a tied one is read whole by the LM head)."""
    total = sum(int(t.n_bytes) for t in tensors.values())
    embd = tensors.get("token_embd.weight")
    if embd is not None and "output.weight" in tensors and len(embd.shape) == 2:
        total -= int(embd.n_bytes) - int(embd.n_bytes) // int(embd.shape[0])
    return total


def main_type(tensors: dict) -> str:
    """The stored type holding most bytes among the matrices (e.g. "Q4_1")."""
    by_type: dict[str, int] = {}
    for t in tensors.values():
        if len(t.shape) >= 2:
            by_type[t.qtype.name] = by_type.get(t.qtype.name, 0) + int(t.n_bytes)
    return max(by_type, key=by_type.get) if by_type else "F32"


def _compile_timed(lm, ctx: int, max_chunk: int, cache: str, **options):
    """Compile with the C backend using ``cache`` as the compile cache; (step, seconds)."""
    from ..backend.c.compiler import CACHE_ENV
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = cache
    try:
        t0 = time.perf_counter()
        step = lm.compile(ctx, max_chunk=max_chunk, backend="c", **options)
        return step, time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = old


def _log_to_stderr(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _make_peer(name: str, path: str, threads: int, ctx: int, batch: int):
    if name == "llama.cpp":
        return LlamaCppEngine(path, threads, ctx, batch)
    if name == "pytorch":
        return TorchEngine(path, threads)
    if name == "pytorch-bf16":
        return TorchEngine(path, threads, dtype="bfloat16")
    raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")


def run_bench(opts: BenchOptions, log: Callable[[str], None] = _log_to_stderr) -> dict[str, Any]:
    """Run the benchmark; returns the report as a JSON-ready dict (see ``lightspeed bench --json``)."""
    from ..api import default_model_path
    from ..backend.c import set_num_threads
    from ..cli_generate import activation_options, kv_cache_options
    from ..models import load_model
    from ..requant import parse_target, quantize_gguf, requantize_model

    if opts.prompt_tokens < 1 or opts.decode_tokens < 1 or opts.runs < 1:
        raise ValueError(f"bench: prompt tokens ({opts.prompt_tokens}), decode tokens ({opts.decode_tokens}) and "
                         f"runs ({opts.runs}) must be positive")
    path = os.path.abspath(opts.model) if opts.model else default_model_path()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"bench: no GGUF file at {path!r} (bench reads .gguf files)")
    target = parse_target(opts.quant) if opts.quant else None
    threads = opts.threads or available_cores()
    set_num_threads(threads)  # also loads the thread pool, so the cold compile below excludes it
    rss = PeakRSS()
    scratch = tempfile.mkdtemp(prefix="lightspeed-bench-")
    try:
        t0 = time.perf_counter()
        lm = load_model(path, tokenizer=False)
        if not hasattr(getattr(lm, "weights", None), "file"):
            raise ValueError(f"bench: {path} did not load as a GGUF model")
        # no tokenizer is built here, so the vocabulary (~8 MB of Python strings) would otherwise stay in the
        # metadata for the whole run, memory a generating process (load_model with a tokenizer) does not hold
        lm.weights.file.release_vocabulary()
        if target is not None:
            log(f"requantizing to {target.name} in memory")
            requantize_model(lm, target)
        load_s = time.perf_counter() - t0
        tensors = lm.weights.file.tensors
        per_token = weight_bytes_per_token(tensors)
        ctx = opts.prompt_tokens + opts.decode_tokens
        if ctx > lm.config.context_length:
            raise ValueError(f"bench: {opts.prompt_tokens} + {opts.decode_tokens} tokens exceed the model's "
                             f"context of {lm.config.context_length}")
        max_chunk = min(opts.prompt_tokens, 512)
        log(f"compiling (cold cache: {scratch}/cache)")
        cache = os.path.join(scratch, "cache")
        options = {**activation_options(opts.activations), **kv_cache_options(opts.kv_cache)}
        step, cold_s = _compile_timed(lm, ctx, max_chunk, cache, **options)
        prompt = np.random.default_rng(opts.seed).integers(0, lm.config.vocab_size, opts.prompt_tokens)
        # Lightspeed's peak memory is that of one untimed run straight after the first compile, as in a process
        # that loads, compiles and generates; read before the second compile (its freed first program would
        # leave ~3 MB of fragments), the probe's buffer or any peer shares the process
        peak_rss = rss.peak_bytes()
        rss.reset()  # the run's own peak: from what load and compile left resident
        first = LightspeedEngine(step)
        first.run(prompt, opts.decode_tokens)
        run_rss = rss.peak_bytes()
        peak_rss = max(peak_rss, run_rss)
        # right after the run, resident memory is at (or within a few pages of) the run's peak
        breakdown = rss_breakdown(path, {"kv_cache": list(first.caches.values())})
        breakdown["step_arena_size"] = int(getattr(step.program.executor, "arena_bytes", 0))
        del first, step  # the warm compile copies the weights again, as a new process would
        step, warm_s = _compile_timed(lm, ctx, max_chunk, cache, **options)
        engines = [LightspeedEngine(step)]
        engines[0].run(prompt, opts.decode_tokens)  # untimed: pages the caches in and starts the threads
        skipped: dict[str, str] = {}
        if opts.peers:
            peer_path = path
            if target is not None:  # the peers read the same weights: a file requantized the same way
                peer_path = os.path.join(scratch, f"peer.{target.name}.gguf")
                log(f"writing {target.name} GGUF for the peers")
                quantize_gguf(path, peer_path, target)
            for name in opts.peer_names:
                try:
                    log(f"loading peer {name}")
                    engines.append(_make_peer(name, peer_path, threads, ctx, max_chunk))
                except ImportError as e:
                    skipped[name] = f"not installed ({e})"
                except Exception as e:  # a peer that cannot run this model is reported, not fatal
                    skipped[name] = f"{type(e).__name__}: {e}"
            for name, why in skipped.items():
                log(f"peer {name} skipped: {why}")
        for e in engines[1:]:  # untimed, as for Lightspeed
            e.run(prompt, opts.decode_tokens)
        timings = {e.name: Timings() for e in engines}
        probes = []
        for r in range(opts.runs):
            probes.append(measure_read_bandwidth(per_token, threads, opts.probe_reps))
            for e in engines:
                time.sleep(PAUSE_S)
                pre, dec = e.run(prompt, opts.decode_tokens)
                timings[e.name].prefill_s.append(pre)
                timings[e.name].decode_s.append(dec)
            log(f"run {r + 1}/{opts.runs}: " + ", ".join(
                f"{e.name} {opts.decode_tokens / timings[e.name].decode_s[-1]:.1f} tok/s decode" for e in engines)
                + f", bandwidth {probes[-1].best_gb_per_s:.1f} GB/s")
        report = _report(opts, path, target, threads, tensors, per_token, load_s, cold_s, warm_s, peak_rss,
                         run_rss if rss.resettable else None, engines, timings, probes, skipped)
        report["rss_breakdown_bytes"] = breakdown
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _report(opts, path, target, threads, tensors, per_token, load_s, cold_s, warm_s, peak_rss, run_rss,
            engines, timings, probes, skipped) -> dict[str, Any]:
    from ..cli_generate import kv_cache_name
    ls = timings["lightspeed"].rates(opts.prompt_tokens, opts.decode_tokens)
    bandwidths = [p.best_gb_per_s for p in probes]
    # each run's decode rate against the limit measured just before it
    percents = [100.0 * rate * per_token / 1e9 / bw for rate, bw in zip(ls["decode_runs"], bandwidths)]
    bandwidth = statistics.median(bandwidths)
    by_type: dict[str, int] = {}
    for t in tensors.values():
        by_type[t.qtype.name] = by_type.get(t.qtype.name, 0) + int(t.n_bytes)
    report: dict[str, Any] = {
        "model": path,
        "model_file_bytes": os.path.getsize(path),
        "quant": target.name if target is not None else main_type(tensors),
        "requantized_in_memory": target is not None,
        "activations": opts.activations,
        "kv_cache": kv_cache_name(opts.kv_cache),
        "weight_bytes_by_type": by_type,
        "threads": threads,
        "prompt_tokens": opts.prompt_tokens,
        "decode_tokens": opts.decode_tokens,
        "runs": opts.runs,
        **{k: v for k, v in ls.items()},
        "weight_bytes_per_token": per_token,
        "effective_gb_per_s": ls["decode_tokens_per_s"] * per_token / 1e9,
        "bandwidth_gb_per_s": bandwidth,
        "bandwidth_runs_gb_per_s": bandwidths,
        "limit_tokens_per_s": bandwidth * 1e9 / per_token,
        "percent_of_limit": statistics.median(percents),
        "load_s": load_s,
        "compile_s_cold": cold_s,
        "compile_s_warm": warm_s,
        "peak_rss_bytes": peak_rss,
        "peak_rss_scope": "lightspeed load, compile and one run" if run_rss is not None else "whole process so far",
        "peak_rss_run_bytes": run_rss,  # the high-water mark of one prefill+decode run alone
        "peers": {},
        "peers_skipped": skipped,
        "engines": {e.name: e.label for e in engines},
        "machine": machine_summary(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "lightspeed_revision": source_revision(),
        "options": {k: v for k, v in asdict(opts).items() if k != "peer_names"},
    }
    for e in engines[1:]:
        peer = timings[e.name].rates(opts.prompt_tokens, opts.decode_tokens)
        peer["lightspeed_decode_ratio"] = ls["decode_tokens_per_s"] / peer["decode_tokens_per_s"]
        peer["lightspeed_prefill_ratio"] = ls["prefill_tokens_per_s"] / peer["prefill_tokens_per_s"]
        report["peers"][e.name] = peer
    return report
