"""Generated float32 GEMM (templates off) against numpy/OpenBLAS and the machine's FMA peak.

Each shape is compiled through ``g.compile(..., backend="c", templates=False)``; rounds alternate
Lightspeed and numpy (a pause between them lets the other engine's spinning threads sleep), and the
report gives GFLOP/s min/median over rounds, the ratio of medians, and the FMA peak measured in the same
run by a small C probe (independent FMA chains on the widest vectors, one pthread per thread).

    python benchmarks/gemm.py [--rounds 7] [--threads 2] [--json] [--shapes 1024x1024x1024,128x768x768]
                              [--cpu-time]

``--cpu-time`` (with ``--threads 1``) times the calling thread's CPU time instead of the wall clock: both
engines then run on that thread, and time the machine gives to other jobs is not counted, so ratios stay
steady on a shared machine (the FMA peak probe still measures wall time).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import lightspeed as ls
from lightspeed.backend.c import set_num_threads
from lightspeed.bench.machine import machine_summary

SHAPES = ["1024x1024x1024", "512x768x3072", "128x768x768"]  # M x K x N

PEAK_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef float vf __attribute__((vector_size(VB)));
static double now(void) { struct timespec t; clock_gettime(CLOCK, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define CH(i) vf a##i = x * (float)(i + 1) * 1e-3f;
#define UP(i) a##i = a##i * x + y;
static void *run(void *arg) {
    vf x = {0}, y = {0};
    x = x + 0.999f; y = y + 1e-4f;
    CH(0) CH(1) CH(2) CH(3) CH(4) CH(5) CH(6) CH(7) CH(8) CH(9) CH(10) CH(11)
    long n = *(long *)arg;
    for (long r = 0; r < n; r++) {
        UP(0) UP(1) UP(2) UP(3) UP(4) UP(5) UP(6) UP(7) UP(8) UP(9) UP(10) UP(11)
    }
    vf s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    *(float *)arg = s[0];
    return 0;
}
int main(int argc, char **argv) {
    int t = atoi(argv[1]); long n = 20000000;
    pthread_t th[64]; long args[64];
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (int i = 0; i < t; i++) { args[i] = n; pthread_create(&th[i], 0, run, &args[i]); }
        for (int i = 0; i < t; i++) pthread_join(th[i], 0);
        double g = 2.0 * 12 * (VB / 4) * n * t / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    printf("%f\n", best);
    return 0;
}
"""


def fma_peak_gflops(threads: int, cpu_time: bool = False) -> float | None:
    """Float32 FMA GFLOP/s of ``threads`` threads (12 independent chains on the widest vectors); by the
    process's CPU time with ``cpu_time`` (one thread: the time it ran, not the time it waited)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vb = 64 if " avx512f" in flags else 32
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d, "peak.c"), Path(d, "peak")
        src.write_text(PEAK_C)
        try:
            clock = "CLOCK_PROCESS_CPUTIME_ID" if cpu_time else "CLOCK_MONOTONIC"
            subprocess.run(["gcc", "-O2", "-march=native", f"-DVB={vb}", f"-DCLOCK={clock}",
                            "-mprefer-vector-width=512", "-pthread", str(src), "-o", str(exe)],
                           check=True, capture_output=True)
            out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError):
            return None
    return float(out.stdout)


def limit_blas_threads(n: int) -> bool:
    """Limit numpy's BLAS to ``n`` threads (threadpoolctl, else the OpenBLAS numpy loaded, through its own
    setter); False when neither is available."""
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
        return True
    except ImportError:
        pass
    maps = Path("/proc/self/maps")
    libs = {line.split()[-1] for line in maps.read_text().splitlines() if "openblas" in line.lower()} \
        if maps.exists() else set()
    for lib in libs:
        dll = ctypes.CDLL(lib)
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(dll, name):
                getattr(dll, name)(ctypes.c_int(n))
                return True
    return False


def bench_shape(shape: str, rounds: int, transposed: bool, clock=time.perf_counter) -> dict:
    m, k, n = (int(x) for x in shape.split("x"))
    g = ls.Graph()
    a = g.input("a", (m, k), ls.float32)
    b = g.input("b", (n, k) if transposed else (k, n), ls.float32)
    prog = g.compile([a @ (b.T if transposed else b)], backend="c", templates=False)
    rng = np.random.default_rng(0)
    av = rng.standard_normal((m, k), dtype=np.float32)
    bv = rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32)
    ref = av @ (bv.T if transposed else bv)
    (got,) = prog(a=av, b=bv)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-2 * np.sqrt(k))
    flop = 2.0 * m * n * k
    inner = max(1, int(1e10 // flop))  # calls per round: about 0.1 s a round at 100 GFLOP/s
    lst, npt = [], []

    def once(fn) -> float:
        fn()
        t = clock()
        for _ in range(inner):
            fn()
        return (clock() - t) / inner
    for _ in range(rounds):
        lst.append(once(lambda: prog(a=av, b=bv)))
        time.sleep(0.1)
        npt.append(once(lambda: av @ (bv.T if transposed else bv)))
        time.sleep(0.1)
    gf = lambda ts: (flop / max(ts) / 1e9, flop / statistics.median(ts) / 1e9, flop / min(ts) / 1e9)  # noqa: E731
    ls_g, np_g = gf(lst), gf(npt)
    return {"shape": f"{m}x{k}x{n}" + (" (b transposed)" if transposed else ""),
            "lightspeed_gflop_s": {"min": ls_g[0], "median": ls_g[1], "best": ls_g[2]},
            "numpy_gflop_s": {"min": np_g[0], "median": np_g[1], "best": np_g[2]},
            "ratio_median": statistics.median(npt) / statistics.median(lst),
            "ratio_best": min(npt) / min(lst)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu-time", action="store_true", help="time thread CPU time (needs --threads 1)")
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time needs --threads 1 (other threads' work is not the calling thread's CPU time)")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    set_num_threads(args.threads)
    np.ones((2, 2)) @ np.ones((2, 2))  # load numpy's BLAS before limiting it
    limited = limit_blas_threads(args.threads)
    if args.cpu_time and not limited:
        ap.error("--cpu-time: numpy's BLAS thread count cannot be limited here (install threadpoolctl)")
    peak = fma_peak_gflops(args.threads, cpu_time=args.cpu_time)
    rows = [bench_shape(s, args.rounds, t, clock) for s in args.shapes.split(",") for t in (False, True)]
    report = {"threads": args.threads, "fma_peak_gflop_s": peak, "machine": machine_summary(), "rows": rows,
              "date": time.strftime("%Y-%m-%d"), "clock": "thread CPU time" if args.cpu_time else "wall",
              "blas_threads_limited": limited}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{report['machine'].get('cpu', '')}, {args.threads} threads, {report['clock']}, FMA peak "
          f"{peak:.0f} GFLOP/s" if peak else "FMA peak: probe failed")
    print(f"{'shape (MxKxN)':32} {'lightspeed GF/s med (min-best)':>32} {'numpy GF/s med':>16} {'ratio med':>10} "
          f"{'% peak':>7}")
    for r in rows:
        lg, ng = r["lightspeed_gflop_s"], r["numpy_gflop_s"]
        pct = f"{100 * lg['median'] / peak:.0f}%" if peak else "-"
        print(f"{r['shape']:32} {lg['median']:10.1f} ({lg['min']:.1f}-{lg['best']:.1f}){'':>8} {ng['median']:16.1f} "
              f"{r['ratio_median']:10.2f} {pct:>7}")


if __name__ == "__main__":
    main()
