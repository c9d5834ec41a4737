"""Decode attention over a KV cache in the models' layout against a head-major one, the same kernel.

The models store a layer's keys (and values) as ``[position, kv_head, head_dim]``: one KV head's row is
``head_dim`` elements of every ``kv_heads * head_dim``. A head-major cache ``[kv_head, position, head_dim]``
holds each head's rows back to back. This builds one attention of ``--rows`` query rows per KV head (SmolLM2's
3 KV heads of 64 unless ``--kv-heads`` and ``--head-dim`` say otherwise; float16 caches) over ``--pos`` keys in
both layouts and times its kernel (``profile=True``): "hot" reruns one layer's cache (it stays in L2), "cold"
walks ``--layers`` caches in turn, as a decode step does. Prints microseconds per layer and the cache bytes
read per second, median of ``--rounds``.

    python benchmarks/attention_layout.py [--threads 1] [--rows 3] [--pos 512] [--layers 60] [--rounds 15]
    python benchmarks/attention_layout.py --kv-heads 1 --head-dim 256 --rows 4 --layers 36   # Gemma 3 270M
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from lightspeed import dtypes as dt
from lightspeed import symbolic as sym
from lightspeed.backend.c import set_num_threads
from lightspeed.bench.machine import machine_summary
from lightspeed.frontend import scaled_dot_product_attention
from lightspeed.graph import Graph

KV_HEADS, HEAD_DIM = 3, 64


def build(layout: str, ctx: int, rows: int, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM):
    """The compiled attention over caches of ``layout`` ("interleaved" or "head-major") and their shape
    (SmolLM2's KV heads by default; Gemma 3 270M: 1 of 256, 4 rows)."""
    g = Graph()
    pos = sym.dim("pos", 1, ctx)
    q = g.input("q", (kv_heads, rows, head_dim), dt.float32)
    shape = (ctx, kv_heads, head_dim) if layout == "interleaved" else (kv_heads, ctx, head_dim)
    k = g.input("k", shape, dt.float16)
    v = g.input("v", shape, dt.float16)
    if layout == "interleaved":
        keys, values = (c[:pos].cast(dt.float32).permute(1, 0, 2) for c in (k, v))
    else:
        keys, values = (c[:, :pos].cast(dt.float32) for c in (k, v))
    return g.compile([scaled_dot_product_attention(q, keys, values)], backend="c", profile=True), shape


def per_layer(prog, caches, q, pos: int, hot: bool) -> float:
    """Seconds of the attention kernel per layer, over every layer's caches (or the first one's again)."""
    ex = prog.executor
    ex.kernel_times(reset=True)
    layers = len(caches) // 2
    for i in range(layers):
        j = 0 if hot else i
        prog(dims={"pos": pos}, q=q, k=caches[2 * j], v=caches[2 * j + 1])
    return sum(s for name, s in ex.kernel_times(reset=True) if name.endswith("attention")) / layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=3, help="query rows per KV head (decode: the grouping, 3)")
    ap.add_argument("--pos", type=int, default=512, help="keys attended")
    ap.add_argument("--ctx", type=int, default=2048, help="the caches' rows")
    ap.add_argument("--layers", type=int, default=60, help="caches walked in turn (SmolLM2: 30 layers x K, V)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--kv-heads", type=int, default=KV_HEADS, help="KV heads a layer (SmolLM2: 3; Gemma 3 270M: 1)")
    ap.add_argument("--head-dim", type=int, default=HEAD_DIM, help="features a head (SmolLM2: 64; Gemma 3: 256)")
    args = ap.parse_args()
    set_num_threads(args.threads)
    print(machine_summary())
    rng = np.random.default_rng(0)
    q = rng.standard_normal((args.kv_heads, args.rows, args.head_dim)).astype(np.float32)
    read = args.pos * args.kv_heads * args.head_dim * 2 * 2  # keys and values, float16
    for layout in ("interleaved", "head-major"):
        prog, shape = build(layout, args.ctx, args.rows, args.kv_heads, args.head_dim)
        caches = [(rng.standard_normal(shape) * 0.5).astype(np.float16) for _ in range(2 * args.layers)]
        for hot in (True, False):
            t = statistics.median(per_layer(prog, caches, q, args.pos, hot) for _ in range(args.rounds))
            print(f"{layout:11s} {'hot ' if hot else 'cold'}: {t * 1e6:7.1f} us a layer, {read / t / 1e9:5.1f} GB/s "
                  f"(threads {args.threads}, rows {args.rows}, pos {args.pos})")


if __name__ == "__main__":
    main()
