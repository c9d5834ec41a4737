"""Quantized matmul kernel: the matrices of one SmolLM2-135M decode step (30 layers of q/k/v/o/gate/up/down
plus the 49152x576 logits), random GGUF blocks, run for 1 to 8 activation rows (decode, batched decode)
and more (prefill), with float, int8 or int16 activations. ``--shapes gemma``: Gemma 3 270M's matrices (18
layers, hidden 640, FFN 2048, 4 x 256 query and 256 key/value features, no logits), of which the K-quants
(q4_k, q6_k: 256-element super-blocks) take those whose input size is a multiple of 256 (o and down).

Times are the kernels' own (backend option profile=True), so Python call overhead is excluded; the
weights (about 143 MB at Q8_0) exceed the last-level cache, so one row measures the weight stream.
Prints, per row count, the min and median over runs of the time per call, the weight bytes per second,
and the time relative to one row. Machines here are shared and noisy: compare ratios within one run.

    python benchmarks/qmatmul.py [--quant q8_0] [--rows 1,2,4,8,64] [--layers 30] [--runs 10] [--threads N] [--json]
    python benchmarks/qmatmul.py --activations int8 --rows 1,2,4,8 --ab LS_NO_VNNI   # A/B: VNNI on, off
    python benchmarks/qmatmul.py --quant q4_1 --activations int16 --rows 1,2,4,8 --ab LS_NO_QDOT16X16
    python benchmarks/qmatmul.py --shapes gemma --quant q4_k --activations float,int16 --rows 1,2,8,64

``--ab MACRO`` also compiles each program with ``-DMACRO`` added to the default flags and times both in
the same runs, interleaved, printing the time with the macro over the time without.
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

import lightspeed as ls
from lightspeed.backend.c import default_flags, set_num_threads
from lightspeed.quant import QType, block_format
from lightspeed.quant.decode_graph import dequant_matrix_graph

# (hidden, FFN, query features, key/value features, vocabulary or 0 for no logits, layers)
SHAPES = {"smollm2": (576, 1536, 576, 192, 49152, 30), "gemma": (640, 2048, 1024, 256, 0, 18)}
# byte offsets of each format's float16 scale fields (kept finite and small)
SCALE_FIELDS = {QType.Q8_0: [0], QType.Q4_0: [0], QType.Q4_1: [0, 2], QType.Q5_0: [0], QType.Q4_K: [0, 2],
                QType.Q6_K: [208]}


def layer_matrices(shapes: str) -> list[tuple[str, int, int]]:
    """(name, out, in) of one layer's matrices."""
    hidden, ffn, q, kv, _, _ = SHAPES[shapes]
    return [("q", q, hidden), ("k", kv, hidden), ("v", kv, hidden), ("o", hidden, q),
            ("gate", ffn, hidden), ("up", ffn, hidden), ("down", hidden, ffn)]


def random_blocks(qtype: QType, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with small finite float16 scales (and mins) at the format's scale offsets."""
    fmt = block_format(qtype)
    nb = k // fmt.block_elems
    raw = rng.integers(0, 256, size=(rows, nb, fmt.block_bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        d = rng.uniform(-0.05, 0.05, (rows, nb)).astype(np.float16)
        raw[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * fmt.block_bytes)


def build(qtype: QType, layers: int, rng: np.random.Generator, shapes: str = "smollm2"
          ) -> tuple[ls.Graph, list, int]:
    g = ls.Graph()
    seq = ls.dim("seq", 1, 512)
    hidden, _, _, _, vocab, _ = SHAPES[shapes]
    elems = block_format(qtype).block_elems
    mats = [(n, k) for _ in range(layers) for _, n, k in layer_matrices(shapes) if k % elems == 0]
    if vocab and hidden % elems == 0:
        mats.append((vocab, hidden))
    if not mats:
        raise SystemExit(f"{qtype.name}: no matrix of the {shapes} shapes has an input size divisible by {elems}")
    inputs = {k: g.input(f"x{k}", (seq, k)) for k in sorted({k for _, k in mats})}
    outs, nbytes = [], 0
    for n, k in mats:
        raw = random_blocks(qtype, n, k, rng)
        nbytes += raw.nbytes
        outs.append(inputs[k].linear(dequant_matrix_graph(g.constant(raw), qtype)))
    return g, outs, nbytes


def run(quant: str, rows: list[int], layers: int | None, runs: int, activations: str, ab: str | None = None,
        shapes: str = "smollm2") -> list[dict]:
    """One result per program: the default build, then (``ab``) the build with ``-D<ab>``."""
    qtype = QType[quant.upper()]
    rng = np.random.default_rng(0)
    g, outs, nbytes = build(qtype, SHAPES[shapes][-1] if layers is None else layers, rng, shapes)
    widths = {name: int(node.shape[-1]) for name, node in g.inputs.items()}  # each input's features
    variants = [("", None)] + ([(ab, default_flags() + [f"-D{ab}"])] if ab else [])
    progs = [g.compile(outs, backend="c", profile=True, activations=activations, flags=f) for _, f in variants]
    for prog in progs:
        assert sum(k.kind == "qmatmul" for k in prog.executor.plan.kernels) == len(outs)
    times = [{m: [] for m in rows} for _ in progs]
    for _ in range(runs):
        for m in rows:  # interleaved, so that a noisy moment hits every row count (and variant) alike
            feed = {name: rng.standard_normal((m, k), dtype=np.float32) for name, k in widths.items()}
            for prog, t in zip(progs, times):
                ex = prog.executor
                prog(**feed)
                ex.kernel_times(reset=True)
                prog(**feed)
                t[m].append(sum(t for name, t in ex.kernel_times(reset=True) if name.endswith(":qmatmul")))
    results = []
    for (macro, _), tv in zip(variants, times):
        base = min(tv[rows[0]])
        res = {"quant": quant, "shapes": shapes, "activations": activations, "weight_bytes": nbytes,
               "defines": [macro] if macro else [], "rows": {}}
        for m in rows:
            best, med = min(tv[m]), statistics.median(tv[m])
            res["rows"][m] = {"ms": best * 1e3, "median_ms": med * 1e3, "gb_per_s": nbytes / best / 1e9,
                              f"vs_{rows[0]}_row": best / base}
            if macro:  # the same call timed in the default build, in the same runs
                res["rows"][m].update(ratio_min=best / min(times[0][m]),
                                      ratio_median=med / statistics.median(times[0][m]))
        results.append(res)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quant", default="q8_0", choices=["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k"])
    ap.add_argument("--shapes", default="smollm2", choices=sorted(SHAPES), help="whose matrices (default SmolLM2)")
    ap.add_argument("--rows", default="1,2,4,8,64", help="activation row counts (the first is the reference)")
    ap.add_argument("--layers", type=int, help="layers (default: the model's)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--activations", default="float,int8", help="float, int8, int16 or several, comma-separated")
    ap.add_argument("--threads", type=int, help="threads of the C backend (default: all cores)")
    ap.add_argument("--ab", metavar="MACRO", help="also time a build with -DMACRO (e.g. LS_NO_VNNI), interleaved")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    if a.threads:
        set_num_threads(a.threads)
    results = [r for act in a.activations.split(",")
               for r in run(a.quant, rows, a.layers, a.runs, act, a.ab, a.shapes)]
    if a.json:
        print(json.dumps(results, indent=1))
        return
    for r in results:
        with_ = f", built with -D{r['defines'][0]}" if r["defines"] else ""
        print(f"{r['quant']} x {r['activations']} activations{with_}, {r['weight_bytes'] / 1e6:.0f} MB of weights:")
        for m, v in r["rows"].items():
            ab = (f"  x{v['ratio_min']:.2f} (median x{v['ratio_median']:.2f}) the default build's time"
                  if "ratio_min" in v else "")
            print(f"  {m:4d} rows: {v['ms']:8.2f} ms (median {v['median_ms']:8.2f})  {v['gb_per_s']:6.1f} GB/s  "
                  f"x{v[f'vs_{rows[0]}_row']:.2f} the time of {rows[0]} row(s){ab}")


if __name__ == "__main__":
    main()
