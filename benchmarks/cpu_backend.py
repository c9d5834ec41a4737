"""CPU-backend benchmarks: Lightspeed's C backend against numpy in the same run.

Prints min and median over several runs of each and the ratio (numpy time / Lightspeed
time, so > 1 means Lightspeed is faster). Timings are noisy on shared machines; compare
the ratios, which are measured back to back.

    python benchmarks/cpu_backend.py [--runs 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import lightspeed as ls


def timeit(fn, runs: int, inner: int = 1) -> tuple[float, float]:
    """(min, median) seconds per call over ``runs`` repetitions of ``inner`` calls."""
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t) / inner)
    return min(times), statistics.median(times)


def bench_overhead(runs: int) -> dict:
    g = ls.Graph()
    x = g.input("x", (4,), ls.float32)
    prog = g.compile([x * 2.0 + 1.0], backend="c")
    xv = np.ones(4, np.float32)
    ls_t = timeit(lambda: prog(x=xv), runs, 2000)
    np_t = timeit(lambda: xv * 2.0 + 1.0, runs, 2000)
    return {"name": "per-call overhead (tiny graph)", "lightspeed_us": ls_t[0] * 1e6,
            "lightspeed_median_us": ls_t[1] * 1e6, "numpy_us": np_t[0] * 1e6, "target": "< 5 us"}


def bench_matvec(runs: int, n: int = 4096) -> dict:
    g = ls.Graph()
    w = g.input("w", (n, n), ls.float32)
    x = g.input("x", (n,), ls.float32)
    prog = g.compile([w @ x], backend="c")
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((n, n), dtype=np.float32)
    xv = rng.standard_normal(n, dtype=np.float32)
    (got,) = prog(w=wv, x=xv)
    np.testing.assert_allclose(got, wv @ xv, rtol=1e-3, atol=1e-2)
    ls_t = timeit(lambda: prog(w=wv, x=xv), runs)
    np_t = timeit(lambda: wv @ xv, runs)
    gb = wv.nbytes / 1e9
    return {"name": f"float32 matvec {n}x{n}", "lightspeed_gb_s": gb / ls_t[0], "numpy_gb_s": gb / np_t[0],
            "ratio": np_t[0] / ls_t[0], "ratio_median": np_t[1] / ls_t[1], "target": ">= 0.9x numpy"}


def bench_matmul(runs: int, n: int = 1024) -> dict:
    g = ls.Graph()
    a = g.input("a", (n, n), ls.float32)
    b = g.input("b", (n, n), ls.float32)
    prog = g.compile([a @ b], backend="c")
    rng = np.random.default_rng(0)
    av = rng.standard_normal((n, n), dtype=np.float32)
    bv = rng.standard_normal((n, n), dtype=np.float32)
    (got,) = prog(a=av, b=bv)
    np.testing.assert_allclose(got, av @ bv, rtol=1e-3, atol=1e-2)
    ls_t = timeit(lambda: prog(a=av, b=bv), max(3, runs // 4))
    np_t = timeit(lambda: av @ bv, max(3, runs // 4))
    flop = 2 * n ** 3 / 1e9
    return {"name": f"float32 matmul {n}x{n}", "lightspeed_gflop_s": flop / ls_t[0], "numpy_gflop_s": flop / np_t[0],
            "ratio": np_t[0] / ls_t[0], "ratio_median": np_t[1] / ls_t[1], "target": "report"}


def bench_softmax(runs: int, rows: int = 1024, cols: int = 1024) -> dict:
    g = ls.Graph()
    x = g.input("x", (rows, cols), ls.float32)
    prog = g.compile([x.softmax(-1)], backend="c")
    xv = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)

    def np_softmax():
        e = np.exp(xv - xv.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    (got,) = prog(x=xv)
    np.testing.assert_allclose(got, np_softmax(), rtol=1e-4, atol=1e-6)
    ls_t = timeit(lambda: prog(x=xv), runs)
    np_t = timeit(np_softmax, runs)
    return {"name": f"softmax {rows}x{cols}", "lightspeed_ms": ls_t[0] * 1e3, "numpy_ms": np_t[0] * 1e3,
            "ratio": np_t[0] / ls_t[0], "ratio_median": np_t[1] / ls_t[1], "target": ">= 2x numpy"}


def bench_layer_norm(runs: int, rows: int = 1024, cols: int = 1024) -> dict:
    g = ls.Graph()
    x = g.input("x", (rows, cols), ls.float32)
    w = g.input("w", (cols,), ls.float32)
    b = g.input("b", (cols,), ls.float32)
    prog = g.compile([x.layer_norm(w, b, eps=1e-5)], backend="c")
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((rows, cols), dtype=np.float32)
    wv = rng.standard_normal(cols, dtype=np.float32)
    bv = rng.standard_normal(cols, dtype=np.float32)

    def np_ln():
        mu = xv.mean(-1, keepdims=True)
        d = xv - mu
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * wv + bv
    (got,) = prog(x=xv, w=wv, b=bv)
    np.testing.assert_allclose(got, np_ln(), rtol=1e-3, atol=1e-4)
    ls_t = timeit(lambda: prog(x=xv, w=wv, b=bv), runs)
    np_t = timeit(np_ln, runs)
    return {"name": f"layer_norm {rows}x{cols}", "lightspeed_ms": ls_t[0] * 1e3, "numpy_ms": np_t[0] * 1e3,
            "ratio": np_t[0] / ls_t[0], "ratio_median": np_t[1] / ls_t[1], "target": ">= 2x numpy"}


def bench_warm_threads(runs: int) -> dict:
    """A parallel kernel called back to back and after idle gaps (a decode loop calls every few ms)."""
    g = ls.Graph()
    x = g.input("x", (512, 1024), ls.float32)
    prog = g.compile([(x * 2.0).sum(-1)], backend="c")
    xv = np.ones((512, 1024), np.float32)
    back_to_back = timeit(lambda: prog(x=xv), runs, 20)
    out = {"name": "parallel call after idle gaps", "back_to_back_us": back_to_back[0] * 1e6}
    for gap_ms in (5, 20):
        times = []
        for _ in range(runs):
            time.sleep(gap_ms / 1e3)
            t = time.perf_counter()
            prog(x=xv)
            times.append(time.perf_counter() - t)
        out[f"after_{gap_ms}ms_gap_us"] = statistics.median(times) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", nargs="*", help="overhead matvec matmul softmax layer_norm warm_threads")
    args = ap.parse_args()
    benches = {"overhead": bench_overhead, "matvec": bench_matvec, "matmul": bench_matmul,
               "softmax": bench_softmax, "layer_norm": bench_layer_norm, "warm_threads": bench_warm_threads}
    results = [fn(args.runs) for name, fn in benches.items() if not args.only or name in args.only]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        fields = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k != "name")
        print(f"{r['name']}: {fields}")


if __name__ == "__main__":
    main()
