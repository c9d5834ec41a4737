"""benchmarks/qmatmul.py's model shapes: which matrices each block format takes (the K-quants only those whose
input size is a multiple of 256) and that a run times every one of them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from lightspeed.quant import QType, block_format

_spec = importlib.util.spec_from_file_location("qmatmul_bench",
                                               Path(__file__).resolve().parents[1] / "benchmarks" / "qmatmul.py")
qmatmul = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qmatmul)


def _expected_bytes(qtype: QType, shapes: str, layers: int) -> int:
    fmt = block_format(qtype)
    hidden, _, _, _, vocab, _ = qmatmul.SHAPES[shapes]
    mats = [(n, k) for _, n, k in qmatmul.layer_matrices(shapes) if k % fmt.block_elems == 0] * layers
    if vocab and hidden % fmt.block_elems == 0:
        mats.append((vocab, hidden))
    return sum(n * k // fmt.block_elems * fmt.block_bytes for n, k in mats)


# Gemma: a K-quant takes o (1024 inputs) and down (2048), Q5_0 all seven; SmolLM2: a K-quant takes down (1536
# inputs) but not the others nor the logits (576)
@pytest.mark.parametrize("quant,shapes,count", [("q4_k", "gemma", 2), ("q5_0", "gemma", 7), ("q6_k", "smollm2", 1)])
def test_a_run_times_the_matrices_the_format_takes(quant: str, shapes: str, count: int) -> None:
    qtype = QType[quant.upper()]
    _, outs, nbytes = qmatmul.build(qtype, 1, np.random.default_rng(0), shapes)
    assert len(outs) == count
    assert nbytes == _expected_bytes(qtype, shapes, 1)
    (res,) = qmatmul.run(quant, [1, 2], 1, 1, "int16", shapes=shapes)
    assert res["weight_bytes"] == nbytes and set(res["rows"]) == {1, 2}
    assert all(v["ms"] > 0 for v in res["rows"].values())

