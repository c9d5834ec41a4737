"""Random quantized weight blocks for the quantized-matmul tests."""
from __future__ import annotations

import numpy as np

from lightspeed.quant import QType, block_format

# byte offsets of the float16 scale fields in each block (kept finite and small in random blocks)
SCALE_FIELDS = {QType.Q8_0: (0,), QType.Q4_0: (0,), QType.Q4_1: (0, 2), QType.Q5_0: (0,), QType.Q4_K: (0, 2),
                QType.Q6_K: (208,)}
EXTREME = np.array([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1e-4, 300.0], np.float16)


def random_raw(qtype: QType, rows: int, k: int, rng: np.random.Generator, extreme: float = 0.0) -> np.ndarray:
    """``rows`` rows of ``k`` elements as raw blocks [rows, bytes]: random bytes, float16 scales uniform in
    [-0.05, 0.05], a share ``extreme`` of them replaced by extreme values (largest, subnormal, zero)."""
    fmt = block_format(qtype)
    nb = k // fmt.block_elems
    raw = rng.integers(0, 256, size=(rows, nb, fmt.block_bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        d = rng.uniform(-0.05, 0.05, size=(rows, nb)).astype(np.float16)
        if extreme:
            pick = rng.random((rows, nb)) < extreme
            d[pick] = rng.choice(EXTREME, size=int(pick.sum()))
        raw[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)
