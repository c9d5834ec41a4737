"""Generated float32 GEMM on a GPU backend under several schedules, in one run.

Each shape (``M x K x N``: ``x @ w.T`` with ``w [N, K]``, the weight layout of the models) is compiled once
per schedule through ``g.compile(..., backend=B, schedules=...)``; rounds alternate the schedules, and the
report gives each one's GFLOP/s min/median and its median's ratio to the first schedule's. A schedule is
``default`` (the heuristics' for the device), ``search`` (the schedule ``search=1`` picks on the device, see
docs/search.md) or ``TMxTNxD/RMxRN`` (tile m x tile n x panel depth / register block), e.g. ``64x64x16/4x4``.

    python benchmarks/gpu_gemm.py [--backend opencl] [--rounds 5] [--shapes 256x512x512]
                                  [--schedules default,64x64x16/4x4] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import lightspeed as ls
from lightspeed.bench.machine import machine_summary
from lightspeed.kernel.schedule import Parallel, Register, Schedule, Tile


def parse_schedule(text: str) -> Schedule | None:
    """None for ``default``, else the schedule ``TMxTNxD/RMxRN`` names."""
    if text == "default":
        return None
    tiles, _, block = text.partition("/")
    tm, tn, d = (int(v) for v in tiles.split("x"))
    rm, rn = (int(v) for v in block.split("x"))
    return Schedule((Parallel("m"), Parallel("n"), Tile("m", tm), Tile("n", tn), Tile("k", d), Register("m", rm),
                     Register("n", rn)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="opencl", choices=["opencl", "cuda"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="256x512x512,512x768x768")
    ap.add_argument("--schedules", default="default,64x64x16/4x4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = args.schedules.split(",")
    rows = []
    for shape in args.shapes.split(","):
        M, K, N = (int(v) for v in shape.split("x"))
        g = ls.Graph()
        x, w = g.input("x", (M, K)), g.input("w", (N, K))
        out = x @ w.T
        rng = np.random.default_rng(0)
        arrays = dict(x=rng.standard_normal((M, K)).astype(np.float32),
                      w=rng.standard_normal((N, K)).astype(np.float32))
        want = arrays["x"] @ arrays["w"].T
        progs, chosen = {}, {}
        for name in names:
            if name == "search":
                prog = g.compile([out], backend=args.backend, search=1)
            else:
                s = parse_schedule(name)
                prog = g.compile([out], backend=args.backend, schedules=(lambda k, s=s: s))
            (got,) = prog(**arrays)
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
            progs[name] = prog
            chosen[name] = str(next(k.schedule for k in prog.executor.plan.kernels if k.kind == "gemm"))
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name, prog in progs.items():
                t0 = time.perf_counter()
                prog(**arrays)
                times[name].append(time.perf_counter() - t0)
        flops = 2 * M * N * K
        base = statistics.median(times[names[0]])
        for name in names:
            t = times[name]
            rows.append({"shape": shape, "schedule": name, "rendered": chosen[name],
                         "gflops_min": flops / max(t) / 1e9, "gflops_median": flops / statistics.median(t) / 1e9,
                         "ms_min": 1e3 * min(t), "ms_median": 1e3 * statistics.median(t),
                         "speed_vs_first": base / statistics.median(t)})
    if args.json:
        print(json.dumps({"machine": machine_summary(), "backend": args.backend, "rows": rows}, indent=1))
        return
    m = machine_summary()
    print(f"{m['cpu']}, {m['cores']} cores; backend {args.backend}; {args.rounds} rounds (whole calls, upload "
          "and download included)")
    for r in rows:
        print(f"{r['shape']:>14} {r['schedule']:>14}: {r['ms_min']:8.2f} / {r['ms_median']:8.2f} ms min/median, "
              f"{r['gflops_median']:6.1f} GFLOP/s, {r['speed_vs_first']:5.2f}x the first  [{r['rendered']}]")


if __name__ == "__main__":
    main()
