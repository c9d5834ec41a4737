"""Weights repacked for the 16-row int16 kernels (backend/c/repack.py, qdot16x16.h): the layout is the documented
one, the kernels reading it give exactly the bits of those reading the GGUF layout, the copy takes the place of the
huge-page copy (the original stays where it is for the other readers), a weight already in huge-page memory is
read in place, and cached plans carry their repack slots."""
from __future__ import annotations

import json

import numpy as np
import pytest

import lightspeed as ls
from cpu_flags import has_flags
from lightspeed import memory
from lightspeed.backend.c import plan_cache
from lightspeed.backend.c.compiler import default_flags
from lightspeed.backend.c.repack import GROUP, REPACK_CODES
from lightspeed.quant import QType, block_format, dequant_matrix_graph
from quant_blocks import random_raw
from test_quantized_matmul import build

QTYPES = list(REPACK_CODES)
NO_REPACK = default_flags() + ["-DLS_NO_REPACK16"]
# a build whose repacked layout is the 16-row one whatever the CPU (AVX2 builds read q4_0 and q4_1 in groups of 8)
SIXTEEN_ROW_LAYOUT = default_flags() + ["-DLS_NO_REPACK8"]
needs_vnni = pytest.mark.skipif(not has_flags("avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
                                reason="the repacked layout is read by the AVX-512 VNNI kernels only")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))


def q5_high_bits(qh: np.ndarray) -> np.ndarray:
    """q5_0's high bits as the repacked layout orders them: element e's bit (bit e of qh) at bit 8t + 4 + j for
    e = 4j + t, at bit 8t + j for e = 16 + 4j + t (j, t < 4)."""
    h = np.zeros_like(qh)
    for e in range(32):
        j, t = (e % 16) // 4, e % 4
        h |= ((qh >> np.uint32(e)) & np.uint32(1)) << np.uint32(8 * t + (4 + j if e < 16 else j))
    return h


def reference_layout(raw: np.ndarray, qtype: QType) -> np.ndarray:
    """The layout ls_repack16 documents, written with numpy: per whole group of 16 rows, the scales (q4_1: then
    the mins) block by block, lane by lane, then per block dword j of every lane (bytes 4j..4j+3 of the row's
    quants; q8_0's plus 128; q5_0's first dword, its high bits, reordered by q5_high_bits; q4_k: per super-block
    every dword of it so); the rows after the last whole group as they are."""
    fmt = block_format(qtype)
    rows, rb = raw.shape
    nblk, ns = rb // fmt.block_bytes, 2 if qtype is QType.Q4_1 else 1
    out = raw.copy()
    whole = rows // GROUP * GROUP
    blocks = raw[:whole].reshape(rows // GROUP, GROUP, nblk, fmt.block_bytes)
    if qtype is QType.Q4_K:  # per super-block all of its dwords lane by lane, header and nibbles alike
        dwords = blocks.reshape(rows // GROUP, GROUP, nblk, fmt.block_bytes // 4, 4).transpose(0, 2, 3, 1, 4)
        out[:whole] = dwords.reshape(whole, rb)
        return out
    for g in range(rows // GROUP):
        b = blocks[g]  # [lane, block, bytes]
        scales = [b[:, :, 2 * k:2 * k + 2].transpose(1, 0, 2).reshape(-1) for k in range(ns)]
        dwords = b[:, :, 2 * ns:].reshape(GROUP, nblk, -1, 4).transpose(1, 2, 0, 3)  # [block, dword, lane, byte]
        if qtype is QType.Q5_0:
            dwords = dwords.copy()
            qh = np.ascontiguousarray(dwords[:, 0]).view(np.uint32)
            dwords[:, 0] = q5_high_bits(qh).view(np.uint8).reshape(dwords[:, 0].shape)
        quants = dwords.reshape(-1)
        if qtype is QType.Q8_0:
            quants = quants ^ 0x80
        out[g * GROUP:(g + 1) * GROUP] = np.concatenate(scales + [quants]).reshape(GROUP, rb)
    return out


def executor(prog):
    return prog.executor


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_the_layout_is_the_documented_one(qtype: QType) -> None:
    """ls_repack16 is portable C in every build: its output is the numpy layout, whole groups and tail alike (the
    AVX2 builds' own layout of q4_0 and q4_1 is tests/test_repack8.py's)."""
    from lightspeed.backend.c.library import repack_layout
    rng = np.random.default_rng(7 + int(qtype))
    k = 3 * block_format(qtype).block_elems
    raw = random_raw(qtype, 16, k, rng)
    g, y = build(qtype, k, 16, raw, with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", plan_cache=False, flags=SIXTEEN_ROW_LAYOUT)
    layout = repack_layout(executor(prog)._lib)
    assert layout.rows == 16
    for rows in (16, 40, 7):
        src = random_raw(qtype, rows, k, rng)
        dst = np.zeros_like(src)
        layout.make(src.ctypes.data, dst.ctypes.data, rows, src.shape[1], REPACK_CODES[qtype])
        np.testing.assert_array_equal(dst, reference_layout(src, qtype))
        assert rows < GROUP or not np.array_equal(dst, src)


def test_int16_matmuls_over_a_constant_read_one_repack_slot_per_constant() -> None:
    """Two matmuls of one constant share its slot; a matmul whose weights are an input and float activations get
    none; the kernels name the slot and render the repacked call."""
    rng = np.random.default_rng(3)
    k, n = 64, 48
    g = ls.Graph()
    seq = ls.dim("seq", 1, 16)
    x = g.input("x", (seq, k))
    raw = random_raw(QType.Q4_1, n, k, rng)
    w = dequant_matrix_graph(g.constant(raw), QType.Q4_1)
    other = dequant_matrix_graph(g.constant(random_raw(QType.Q8_0, 32, k, rng)), QType.Q8_0)
    as_input = dequant_matrix_graph(g.input("wraw", raw.shape, ls.uint8), QType.Q4_1)
    outs = [x.linear(w), x.sin().linear(w), x.linear(other), x.linear(as_input)]
    prog = g.compile(outs, backend="c", activations="int16", plan_cache=False)
    plan = executor(prog).plan
    assert [(r.code, r.rows, r.row_bytes) for r in plan.repacks] == [(2, n, raw.shape[1]), (0, 32, 34 * 2)]
    twins = {r.slot for r in plan.repacks}
    qmm = [k for k in plan.kernels if k.kind == "qmatmul"]
    assert sorted(k.template.weights_layout for k in qmm) == ["r16", "r16", "r16", "rows"]
    assert sum(k.template_reads[1].slot in twins for k in qmm) == 3
    assert "ls_qdot16x16r_q4_1" in executor(prog).source
    ref = g.compile(outs, backend="reference")
    xv = rng.standard_normal((5, k)).astype(np.float32)
    for got, want in zip(prog(x=xv, wraw=raw), ref(x=xv, wraw=raw)):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))
    assert executor(g.compile(outs, backend="c", activations="float", plan_cache=False)).plan.repacks == []


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n", [16, 40, 96])
def test_repacked_weights_give_the_bits_of_the_gguf_layout(qtype: QType, n: int) -> None:
    rng = np.random.default_rng(20 + int(qtype) + n)
    k = 18 * 32 if block_format(qtype).block_elems == 32 else 3 * block_format(qtype).block_elems
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=False)
    repacked = g.compile([y], backend="c", activations="int16", plan_cache=False)
    plain = g.compile([y], backend="c", activations="int16", flags=NO_REPACK, plan_cache=False)
    (r,) = executor(repacked).plan.repacks
    # the slot holds the documented layout in this build, the constant itself in the other
    twin = executor(repacked)._repacked[0]
    np.testing.assert_array_equal(twin, reference_layout(raw, qtype))
    assert memory.in_region(twin) and np.array_equal(executor(plain)._repacked[0], raw)
    for m in (1, 3, 8, 20):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        if qtype in (QType.Q5_0, QType.Q4_K) and m > 8:  # read in the GGUF layout, a long call's stay float
            continue
        np.testing.assert_array_equal(repacked(x=xv)[0], plain(x=xv)[0])


@needs_vnni
@pytest.mark.parametrize("qtype", [QType.Q5_0, QType.Q4_K], ids=lambda q: q.name)
def test_short_call_formats_read_repacked_take_int16_at_every_row_count(qtype: QType) -> None:
    """Q5_0 and Q4_K quantize short calls only, their long ones running the float kernel over the GGUF layout; read
    repacked there is no such kernel, so every row count takes the 16-row kernel: within int16 rounding of the
    exact product at every count, the scratch sized for the longest call, and the bits of one row the same in a
    call of one and of twenty rows (the 16-row kernel's lanes do not depend on the call)."""
    rng = np.random.default_rng(44 + int(qtype))
    # two whole groups and a tail of 8 rows (the GGUF layout's masked kernel)
    k, n = (18 * 32 if qtype is QType.Q5_0 else 3 * 256), 40
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", plan_cache=False)
    ref = g.compile([y], backend="reference")
    assert executor(prog).reads_repacked(qtype)
    (kern,) = [kk for kk in executor(prog).plan.kernels if kk.kind == "qmatmul"]
    assert kern.template.weights_layout == "r16" and kern.scratch[0].nbytes >= 64 * k * 2
    xv = rng.standard_normal((20, k)).astype(np.float32)
    for m in (1, 8, 9, 20):
        (got,), (want,) = prog(x=xv[:m]), ref(x=xv[:m])
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert 1e-7 < err < 6e-5, (m, err)  # int16's rounding, not float's
    np.testing.assert_array_equal(prog(x=xv[:1])[0][0], prog(x=xv)[0][0])


def test_a_constant_other_kernels_read_stays_in_the_gguf_layout() -> None:
    """A tied embedding: a row gather and the LM head read one Q8_0 constant, so the head reads it as it is (a
    copy would leave the original resident beside it); an untied head of the same shape is repacked."""
    rng = np.random.default_rng(5)
    vocab, k = 4096, 64
    raw = random_raw(QType.Q8_0, vocab, k, rng)
    raw.flags.writeable = False  # as a weight mapped from a file
    g = ls.Graph()
    seq = ls.dim("seq", 1, 8)
    ids = g.input("ids", (seq,), ls.int32)
    table = g.constant(raw)
    h = (dequant_matrix_graph(table.gather(ids).reshape((-1, raw.shape[1])), QType.Q8_0) * 0.5).sin()
    head = g.constant(random_raw(QType.Q8_0, vocab, k, rng))
    outs = [h.linear(dequant_matrix_graph(table, QType.Q8_0)), h.linear(dequant_matrix_graph(head, QType.Q8_0))]
    prog = g.compile(outs, backend="c", activations="int16", plan_cache=False)
    plan = executor(prog).plan
    slot_of = {id(c): b.slot for b, c in plan.consts}
    assert [r.source_slot for r in plan.repacks] == [slot_of[id(head.node.arg)]]
    ref = g.compile(outs, backend="reference")
    tokens = np.array([3, 4095, 0, 17], np.int32)
    for got, want in zip(prog(ids=tokens), ref(ids=tokens)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))


def test_a_build_reading_the_gguf_layout_points_the_slot_at_the_weights_huge_page_copy() -> None:
    """Portable builds (and every build without the 16-row kernels) read the GGUF layout: the repack slot must
    point where the constant's own slot does, its huge-page copy, not at the original (a file mapping)."""
    rng = np.random.default_rng(9)
    k, n = 4 * 32, 2048  # 147 KB: a weight that gets a huge-page copy
    raw = random_raw(QType.Q4_0, n, k, rng)
    raw.flags.writeable = False  # as a weight mapped from a file
    g, y = build(QType.Q4_0, k, n, raw, with_bias=False)
    ref = g.compile([y], backend="reference")
    xv = rng.standard_normal((2, k)).astype(np.float32)
    for options in (dict(portable=True), dict(flags=NO_REPACK)):
        prog = g.compile([y], backend="c", activations="int16", plan_cache=False, **options)
        ex = executor(prog)
        (r,) = ex.plan.repacks
        (source,) = [a for (b, _), a in zip(ex.plan.consts, ex._consts) if b.slot == r.source_slot]
        assert memory.in_region(source) and len(ex._repacked) == 1 and ex._repacked[0] is source, options
        (got,), (want,) = prog(x=xv), ref(x=xv)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))


@needs_vnni
def test_a_weight_already_in_huge_page_memory_is_read_in_place() -> None:
    """A requantized weight (--quant) lives in huge-page memory already: a repacked copy would hold it twice."""
    rng = np.random.default_rng(6)
    k, n = 4 * 32, 2048
    raw = random_raw(QType.Q4_0, n, k, rng)
    region = memory.HugePageRegion(memory.region_bytes([raw]))
    held = region.copy(raw)
    g, y = build(QType.Q4_0, k, n, held, with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", plan_cache=False)
    plan = executor(prog).plan
    assert plan.repacks == [] and [k.template.weights_layout for k in plan.kernels if k.kind == "qmatmul"] == ["rows"]
    assert held.ctypes.data in [a.ctypes.data for a in executor(prog)._consts]
    plain = g.compile([y], backend="c", activations="int16", flags=NO_REPACK, plan_cache=False)
    xv = rng.standard_normal((2, k)).astype(np.float32)
    np.testing.assert_array_equal(prog(x=xv)[0], plain(x=xv)[0])


def test_cached_plans_carry_their_repacks() -> None:
    rng = np.random.default_rng(8)
    k, n = 64, 32
    raw = random_raw(QType.Q8_0, n, k, rng)
    g, y = build(QType.Q8_0, k, n, raw, with_bias=False)
    first = g.compile([y], backend="c", activations="int16")
    again = g.compile([y], backend="c", activations="int16")
    assert isinstance(executor(again).plan, plan_cache.CachedPlan)
    assert executor(again).plan.repacks == executor(first).plan.repacks != []
    xv = rng.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_array_equal(again(x=xv)[0], first(x=xv)[0])
    # an entry naming a repack of anything but a uint8 constant of its shape is refused
    program = executor(first).program
    table = json.loads(json.dumps(plan_cache._table(program, executor(first).plan)))  # as an entry holds it
    plan_cache.validate(program, table)
    for bad in ([table["repacks"][0][0], 0, 0, n, 68], [table["repacks"][0][0], table["repacks"][0][1], 0, n, 64],
                [table["repacks"][0][0], table["repacks"][0][1], 7, n, 68]):
        with pytest.raises(plan_cache.Uncacheable, match="repack entry"):
            plan_cache.validate(program, dict(table, repacks=[bad]))


@pytest.mark.parametrize("flags", [None, NO_REPACK], ids=["build-repacks", "gguf-layout"])
def test_the_search_runs_plans_with_repack_slots_as_the_executor_does(flags) -> None:
    """Search times plans formed as the compile forms them, repack slots included (search/runner.py): its runner
    binds each slot to the build's repacked copy, or to the constant where the build reads the GGUF layout, and
    gives the executor's outputs."""
    from lightspeed.backend.c.compiler import compile_shared
    from lightspeed.backend.c.render import render_plan
    from lightspeed.search.runner import PlanRunner
    rng = np.random.default_rng(11)
    k, n = 4 * 32, 48
    raw = random_raw(QType.Q8_0, n, k, rng)
    g, y = build(QType.Q8_0, k, n, raw, with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", plan_cache=False, flags=flags)
    plan = executor(prog).plan
    assert len(plan.repacks) == 1
    xv = rng.standard_normal((5, k)).astype(np.float32)
    runner = PlanRunner(plan, compile_shared(render_plan(plan), flags), {"x": xv}, {"seq": 5}, profile=False)
    (got,), (want,) = runner.outputs(), prog(x=xv)
    np.testing.assert_array_equal(got, want)


def test_a_level_2_compile_forms_its_plan_as_the_compile_does() -> None:
    """Search level 2 re-forms a program it rewrote: with the backend's own formation (epilogues fused, repack
    slots), not a plainer plan that runs slower than level 0's."""
    pytest.importorskip("egglog")
    rng = np.random.default_rng(12)
    k, n = 4 * 32, 48
    raw = random_raw(QType.Q8_0, n, k, rng)
    g = ls.Graph()
    seq = ls.dim("seq", 1, 16)
    x = g.input("x", (seq, k))
    w = dequant_matrix_graph(g.constant(raw), QType.Q8_0)
    y = ((x * 1.0).sin().linear(w) + 1.0).exp()  # x * 1: the rewrite differs from the original
    plain = g.compile([y], backend="c", activations="int16", plan_cache=False)
    searched = g.compile([y], backend="c", activations="int16", plan_cache=False, search=2, search_budget_s=20.0)
    assert searched.executor.search_report.graph != "original"
    kinds = [kern.kind for kern in executor(plain).plan.kernels]
    assert [kern.kind for kern in executor(searched).plan.kernels] == kinds  # the epilogue stays in the matmul
    assert len(executor(searched).plan.repacks) == len(executor(plain).plan.repacks) == 1
    xv = rng.standard_normal((5, k)).astype(np.float32)
    np.testing.assert_allclose(searched(x=xv)[0], plain(x=xv)[0], rtol=1e-5)
