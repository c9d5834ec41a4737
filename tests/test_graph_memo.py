"""Graph.memoised: a subgraph built once and replayed over new sources is the graph a fresh build makes."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import quant
from lightspeed.graph import Graph
from lightspeed.quant import QType

from test_quant import _same_bits, random_blocks
from tiny_gguf import write_tiny_llama


def listing(g: ls.Graph) -> list[str]:
    return [repr(n) for n in g.order]


@pytest.mark.parametrize("q", [QType.Q4_1, QType.Q8_0, QType.Q4_K, QType.Q6_K, QType.F16])
def test_replayed_weight_decode_is_the_fresh_graph(q):
    fmt = quant.block_format(q)
    rows, per_row = 8, 2
    raws = [random_blocks(q, rows * per_row, seed=s).reshape(rows, per_row * fmt.block_bytes) for s in (1, 2, 3)]

    def build(fresh: bool):
        g = ls.Graph()
        outs = []
        for k, raw in enumerate(raws):
            if fresh:
                g._templates.clear()  # no template to replay: every decode runs the Tensor-level code
            outs.append(quant.dequant_matrix_graph(g.constant(raw, ls.uint8), q))
        return g, outs

    g_memo, memo = build(False)
    g_fresh, fresh = build(True)
    assert len(g_memo._templates) == 1  # built once, replayed twice
    assert listing(g_memo) == listing(g_fresh)
    assert {k: repr(v) for k, v in g_memo.lowerings.items()} == {k: repr(v) for k, v in g_fresh.lowerings.items()}
    got = g_memo.compile(memo, backend="reference")()
    for raw, out in zip(raws, got):
        want = quant.dequantize_blocks(raw.reshape(-1, fmt.block_bytes), q).reshape(rows, -1)
        assert _same_bits(out, want)


def test_replay_is_hash_consed_with_a_direct_build():
    g = ls.Graph()
    seq = ls.dim("seq", 1, 64)
    a, b, c = (g.input(n, (seq, 8), ls.float32).sqrt() for n in "abc")  # computed: inputs differ by name

    def f(x, y):
        scale = g.constant(np.arange(8, dtype=np.float32))  # a node outside the replayed cone
        return (x * scale + y.sin()).sum(-1), g.iota(seq).cast(ls.float32) * 2.0  # the second needs no source

    first = g.memoised("f", (a, b), f)
    replay = g.memoised("f", (b, c), f)
    direct = f(b, c)
    assert len(g._templates) == 1
    assert all(r.node is d.node and r.st == d.st for r, d in zip(replay, direct))
    assert first[0].node is not replay[0].node and first[1].node is replay[1].node


def test_key_tells_apart_views_dtypes_and_aliased_sources():
    g = ls.Graph()
    x = g.input("x", (4, 4), ls.float32)
    y = g.input("y", (4, 4), ls.float32)
    z = g.input("z", (4, 4), ls.float16)

    def f(p, q):
        return p * 3.0 + q

    g.memoised("f", (x, y), f)
    for srcs in ((x, x), (x.T, y), (z, y)):  # one node twice, another view, another dtype: built afresh
        n = len(g._templates)
        got = g.memoised("f", srcs, f)
        assert len(g._templates) == n + 1
        assert got.node is f(*srcs).node


def test_build_must_return_tensors_of_the_graph():
    g, other = ls.Graph(), ls.Graph()
    x = g.input("x", (2,), ls.float32)
    with pytest.raises(TypeError, match="memoised"):
        g.memoised("bad", (x,), lambda t: other.input("y", (2,), ls.float32))


def test_llama_graph_with_memoised_layers_is_the_fresh_graph(tmp_path, monkeypatch):
    from lightspeed.models import load_model
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    lm = load_model(str(path))
    g_memo, outs_memo, _ = lm.build(64, max_chunk=8)
    monkeypatch.setattr(Graph, "memoised", lambda self, key, sources, build: build(*sources))
    g_fresh, outs_fresh, _ = lm.build(64, max_chunk=8)
    assert listing(g_memo) == listing(g_fresh)
    assert [(o.node.id, o.st) for o in outs_memo] == [(o.node.id, o.st) for o in outs_fresh]
