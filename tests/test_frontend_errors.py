"""Frontend errors for incompatible shapes: each names the op and the shapes involved."""
from __future__ import annotations

import pytest

import lightspeed as ls
from lightspeed import frontend as F


def _inputs(*shapes, dtype=ls.float32):
    g = ls.Graph()
    return g, [g.input(f"t{k}", s, dtype) for k, s in enumerate(shapes)]


def _one(shape_a, shape_b, fn):
    def build():
        _, (a, b) = _inputs(shape_a, shape_b)
        fn(a, b)
    return build


def _sdpa(q, k, v, **kw):
    def build():
        _, (qt, kt, vt) = _inputs(q, k, v)
        F.scaled_dot_product_attention(qt, kt, vt, **kw)
    return build


def _with_mask(mask_shape):
    def build():
        _, (q, k, v, m) = _inputs((2, 4, 3, 8), (2, 4, 3, 8), (2, 4, 3, 8), mask_shape)
        F.scaled_dot_product_attention(q, k, v, m)
    return build


def _conv1d(x, w, **kw):
    def build():
        _, (xt, wt) = _inputs(x, w)
        F.conv1d(xt, wt, **kw)
    return build


def _conv2d(x, w, **kw):
    def build():
        _, (xt, wt) = _inputs(x, w)
        F.conv2d(xt, wt, **kw)
    return build


def _layer_norm(x, w):
    def build():
        _, (xt, wt) = _inputs(x, w)
        F.layer_norm(xt, wt)
    return build


def _rope_positions():
    _, (x, p) = _inputs((5, 2, 8), (4,))
    F.rope(x, p)


def _rope_odd():
    _, (x,) = _inputs((5, 2, 8))
    F.rope(x, rotary_dim=5)


def _embedding_float_ids():
    _, (w, ids) = _inputs((10, 4), (3,))
    F.embedding(w, ids)


def _unfold_short():
    _, (x,) = _inputs((2, 3))
    F.unfold(x, -1, kernel=3, dilation=2)


def _unfold_symbolic_short():
    _, (x,) = _inputs((2, ls.dim("n", 1, 9)))
    F.unfold(x, -1, kernel=3)


def _causal_too_few_keys():
    _sdpa((1, 5, 4), (1, 3, 4), (1, 3, 4), causal=True)()


def _softmax_axis():
    _, (x,) = _inputs((2, 3))
    F.softmax(x, 2)


ERRORS = [
    ("sub", _one((2, 3), (4,), F.sub), ["sub", "(2, 3)", "(4,)"]),
    ("div", _one((2, 3), (2, 2), F.div), ["div", "(2, 3)", "(2, 2)"]),
    ("maximum", _one((2, 3), (5, 1, 2), F.maximum), ["maximum", "(2, 3)", "(5, 1, 2)"]),
    ("pow", _one((3,), (4,), F.pow), ["pow", "(3,)", "(4,)"]),
    ("eq", _one((3,), (2,), F.eq), ["eq", "(3,)", "(2,)"]),
    ("where", _one((2, 3), (3, 3), lambda a, b: F.where(a > 0, a, b)), ["where", "(2, 3)", "(3, 3)"]),
    ("matmul", _one((2, 3), (4, 5), F.matmul), ["matmul", "(2, 3)", "(4, 5)"]),
    ("matmul_batch", _one((2, 3, 4), (3, 4, 5), F.matmul), ["matmul", "(2,)", "(3,)"]),
    ("linear", _one((2, 3), (4, 5), F.linear), ["linear", "(2, 3)", "(4, 5)"]),
    ("concatenate", _one((2, 3), (2, 4), lambda a, b: F.concatenate([a, b], 0)),
     ["concatenate", "(2, 3)", "(2, 4)"]),
    ("stack", _one((2, 3), (3, 2), lambda a, b: F.stack([a, b])), ["stack", "(2, 3)", "(3, 2)"]),
    ("layer_norm_weight", _layer_norm((4, 8), (7,)), ["layer_norm", "(7,)", "(4, 8)"]),
    ("rms_norm_weight", _one((4, 8), (4, 1, 8), F.rms_norm), ["rms_norm", "(4, 1, 8)", "(4, 8)"]),
    ("sdpa_features", _sdpa((2, 3, 8), (2, 3, 4), (2, 3, 4)),
     ["scaled_dot_product_attention", "(2, 3, 8)", "(2, 3, 4)"]),
    ("sdpa_kv_lengths", _sdpa((2, 3, 8), (2, 5, 8), (2, 4, 8)),
     ["scaled_dot_product_attention", "(2, 5, 8)", "(2, 4, 8)"]),
    ("sdpa_heads", _sdpa((1, 6, 3, 8), (1, 4, 3, 8), (1, 4, 3, 8)),
     ["scaled_dot_product_attention", "KV heads", "(1, 6, 3, 8)", "(1, 4, 3, 8)"]),
    ("sdpa_mask", _with_mask((3, 5)), ["scaled_dot_product_attention", "mask", "(3, 5)", "(2, 4, 3, 3)"]),
    ("sdpa_causal", _causal_too_few_keys, ["scaled_dot_product_attention", "causal", "(1, 5, 4)", "(1, 3, 4)"]),
    ("conv1d_channels", _conv1d((1, 4, 9), (2, 3, 3)), ["conv1d", "(1, 4, 9)", "(2, 3, 3)"]),
    ("conv1d_groups", _conv1d((1, 4, 9), (3, 2, 3), groups=2), ["conv1d", "(1, 4, 9)", "(3, 2, 3)", "groups=2"]),
    ("conv1d_rank", _conv1d((1, 1, 4, 9), (2, 4, 3)), ["conv1d", "(1, 1, 4, 9)", "(2, 4, 3)"]),
    ("conv2d_channels", _conv2d((1, 3, 5, 5), (2, 2, 3, 3)), ["conv2d", "(1, 3, 5, 5)", "(2, 2, 3, 3)"]),
    ("conv2d_kernel_too_big", _conv2d((1, 1, 2, 5), (1, 1, 3, 3)), ["unfold", "(1, 1, 1, 2, 5)", "span 3"]),
    ("unfold", _unfold_short, ["unfold", "(2, 3)", "span 5"]),
    ("unfold_symbolic", _unfold_symbolic_short, ["unfold", "(2, n)", "lower bound"]),
    ("rope_positions", _rope_positions, ["rope", "(4,)", "(5, 2, 8)"]),
    ("rope_rotary_dim", _rope_odd, ["rope", "rotary_dim 5", "(5, 2, 8)"]),
    ("embedding_ids", _embedding_float_ids, ["embedding", "float32"]),
    ("softmax_axis", _softmax_axis, ["softmax", "axis 2"]),
]


@pytest.mark.parametrize("build,expected", [(b, e) for _, b, e in ERRORS], ids=[n for n, _, _ in ERRORS])
def test_error_names_op_and_shapes(build, expected) -> None:
    with pytest.raises(ValueError) as info:
        build()
    message = str(info.value)
    for part in expected:
        assert part in message, f"{part!r} is missing from the error message: {message}"


def test_arange_rejects_zero_step() -> None:
    with pytest.raises(ValueError, match="arange: step"):
        F.arange(ls.Graph(), 0, 5, 0)


def test_causal_mask_rejects_empty_window() -> None:
    with pytest.raises(ValueError, match="causal_mask: window"):
        F.causal_mask(ls.Graph(), 3, 0, window=0)


def test_rope_rejects_positions_and_pos() -> None:
    _, (x, p) = _inputs((5, 2, 8), (5,))
    with pytest.raises(ValueError, match="rope: pass either positions or pos"):
        F.rope(x, p.cast(ls.int32), pos=3)
