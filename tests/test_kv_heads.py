"""Head-major KV caches (``kv_update="heads"``, the C backend's default): ``[kv_heads, ctx, head_dim]`` arrays
that the step program updates in place, against the position-major ``"rows"`` caches.

The two layouts hold the same rows (one the transpose of the other) and the programs compute the same logits
from them; the new rows are scattered into the caller's arrays (no copy of a cache, the same array objects
back), calls are checked once per set of arrays (a RowStep with nothing to write), caches that cannot be
updated in place (read-only, not C-contiguous) are refused by name, and the engine's prefix cache copies
blocks along the positions' axis. The batched and mixed steps of the engine take head-major caches too
(``head_major``), sharing them with the single-sequence program, with the same numbers as over position-major
ones.
"""
from __future__ import annotations

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed import api
from lightspeed.engine.batched import BatchedStep
from lightspeed.engine.factory import build_engine
from lightspeed.engine.local import LocalEngine
from lightspeed.engine.mixed import MixedStep
from lightspeed.models import load_model
from lightspeed.models.base import default_kv_update
from lightspeed.prefix_cache import PrefixCache

CTX = 64
TOKENS = [3, 17, 42, 5, 88, 61, 0, 96, 23, 23, 7, 50, 11, 64]
SPLIT = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny Llama file (2 KV heads, so the two layouts differ)."""
    path = tmp_path_factory.mktemp("kvheads") / "tiny.gguf"
    write_tiny_llama(path, seed=5)
    return path


@pytest.fixture(scope="module")
def lm(tiny):
    return load_model(tiny)


@pytest.fixture(scope="module")
def steps(lm):
    """The two layouts' programs (float activations: the same numbers however a prompt is cut)."""
    return {mode: lm.compile(CTX, max_chunk=8, kv_update=mode, activations="float") for mode in ("rows", "heads")}


def run_all(step, caches=None):
    """Logits of a prefill of TOKENS[:SPLIT] (two calls), then of one-token steps; and the final caches."""
    caches = step.new_caches() if caches is None else caches
    out = []
    for lo, hi in ((0, 4), (4, SPLIT)):
        logits, caches = step.run(TOKENS[lo:hi], lo, caches)
        out.append(logits)
    for p in range(SPLIT, len(TOKENS)):
        logits, caches = step.run(TOKENS[p:p + 1], p, caches)
        out.append(logits)
    return np.concatenate(out), caches


def test_default_layout_by_backend(lm, steps):
    assert default_kv_update("c") == "heads" and default_kv_update("opencl") == "rows"
    assert default_kv_update("cuda") == "rows"
    heads, rows = steps["heads"], steps["rows"]
    assert heads.cache_row_axis == 1 and rows.cache_row_axis == 0
    # a backend that returns new arrays for donated inputs would leave the caller's caches stale
    with pytest.raises(ValueError, match="kv_update='heads' needs a backend .* not 'reference'"):
        lm.compile(CTX, max_chunk=8, kv_update="heads", backend="reference")
    c = lm.config
    assert {s.shape for s in heads.cache_specs} == {(c.n_kv_heads, CTX, c.head_dim)}
    assert {s.shape for s in rows.cache_specs} == {(CTX, c.n_kv_heads, c.head_dim)}


def test_same_logits_and_rows_as_position_major(steps):
    want, rows = run_all(steps["rows"])
    got, heads = run_all(steps["heads"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    n = len(TOKENS)
    for name, a in heads.items():
        np.testing.assert_array_equal(a.transpose(1, 0, 2)[:n], rows[name][:n])
        assert not a[:, n:].any()  # nothing written past the last position


def test_written_in_place_with_no_cache_copy(steps):
    step = steps["heads"]
    kernels = step.program.executor.plan.kernels
    assert not [k.name for k in kernels if k.name.endswith("_copy")]  # the scatters write the donated caches
    caches = step.new_caches()
    ids = {name: id(a) for name, a in caches.items()}
    _, out = run_all(step, caches)
    assert {name: id(a) for name, a in out.items()} == ids  # the same arrays, updated
    assert step._row_step is not None and step._row_step.writes == {}  # checked once, nothing to copy


def test_caches_that_cannot_be_updated_in_place_are_refused_by_name(steps):
    step = steps["heads"]
    given = {n: np.asfortranarray(a) for n, a in step.new_caches().items()}
    with pytest.raises(ValueError, match="'k0' is donated .* not C-contiguous"):
        step.run(TOKENS[:4], 0, given)
    frozen = step.new_caches()
    for a in frozen.values():
        a.flags.writeable = False
    with pytest.raises(ValueError, match="'k0' is donated .* read-only"):
        step.run(TOKENS[:4], 0, frozen)
    assert not any(a.any() for a in list(given.values()) + list(frozen.values()))


def test_bad_caches_are_named(steps):
    step = steps["heads"]
    caches = step.new_caches()
    caches["k0"] = np.zeros((CTX,) + caches["k0"].shape[::2], dtype=caches["k0"].dtype)  # position-major
    with pytest.raises(ValueError, match="k0"):
        step.run(TOKENS[:2], 0, caches)
    with pytest.raises(ValueError, match="exceed the context"):
        step.run(TOKENS[:2], CTX - 1, step.new_caches())


def test_prefix_cache_copies_blocks_along_the_positions_axis():
    rng = np.random.default_rng(0)
    src = {"k0": rng.standard_normal((2, 16, 4)).astype(np.float16)}
    cache = PrefixCache(1 << 20, block=4)
    ids = list(range(10))
    assert cache.store(ids, src, axis=1) == 2  # two full blocks of 4
    dst = {"k0": np.zeros_like(src["k0"])}
    assert cache.load(ids + [99], dst, axis=1) == 8
    np.testing.assert_array_equal(dst["k0"][:, :8], src["k0"][:, :8])
    assert not dst["k0"][:, 8:].any()


def test_local_engine_reuses_prefixes_with_head_major_caches(tiny):
    model = api.load(str(tiny), ctx=CTX, progress=False, activations="float")
    rows = api.load(str(tiny), ctx=CTX, progress=False, activations="float", kv_update="rows")
    assert model.step.kv_update == "heads"
    prompt = (TOKENS * 3)[:40]
    want = rows.generate_text("hello there", max_tokens=6)
    assert model.generate_text("hello there", max_tokens=6) == want
    local = LocalEngine(model)
    try:
        assert local.engine.prefix_cache is not None
        first = list(local.generate(prompt, max_tokens=4))
        again = local.generate(prompt, max_tokens=4)
        assert list(again) == first
        assert again.stats.cached_tokens == 32  # the first request's whole block of rows
    finally:
        local.close()


def test_build_engine_shares_head_major_caches_with_the_batched_steps(tiny):
    model = api.load(str(tiny), ctx=CTX, progress=False, activations="float")
    engine = build_engine(model, 3, options={"activations": "float"})
    assert engine.step is model.step and engine.stepper.batched.head_major  # one prefill program, no second
    c = model.lm.config
    assert all(a.shape == (3, c.n_kv_heads, CTX, c.head_dim) for a in engine.stepper.batched.caches.values())
    assert all(a.shape == (c.n_kv_heads, CTX, c.head_dim) for a in engine.stepper.slot_caches(1).values())
    assert engine.prefix_cache is not None and engine.row_axis == 1


@pytest.mark.parametrize("mixed", [False, True])
def test_batched_steps_compute_the_same_in_both_layouts(lm, steps, mixed):
    """Three sequences prefilled into their slots, then a batched step (or a mixed step carrying a chunk of a
    fourth): the same logits and cache rows whether the caches are head-major or position-major, and a slot
    moved down keeps its rows."""
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(3, 128, n)] for n in (5, 17, 33)]
    chunk = [int(t) for t in rng.integers(3, 128, 7)]
    out = {}
    for head_major, mode in ((False, "rows"), (True, "heads")):
        stepper = BatchedStep(lm, CTX, 4, head_major=head_major, activations="float")
        kernels = stepper.program.executor.plan.kernels
        assert [k.kind for k in kernels].count("attention") == lm.config.n_layers  # the streaming kernel
        assert not [k.name for k in kernels if k.name.endswith("_copy")]  # caches written in place
        if mixed:
            stepper = MixedStep(stepper, lm, 8, activations="float")
        single = steps[mode]
        for slot, ids in enumerate(prompts):
            for lo in range(0, len(ids), 8):
                single.run(ids[lo:lo + 8], lo, stepper.slot_caches(slot))
        tokens, positions = [7, 9, 11], [len(p) for p in prompts]
        logits = stepper.run_mixed(tokens, positions, chunk, 0) if mixed else stepper.run(tokens, positions)
        stepper.move_slot(2, 0, positions[2] + 1)
        slots = range(4) if mixed else range(3)
        caches = [{n: np.moveaxis(a, single.cache_row_axis, 0) for n, a in stepper.slot_caches(s).items()}
                  for s in slots]
        out[mode] = logits, caches
    np.testing.assert_allclose(out["heads"][0], out["rows"][0], rtol=1e-5, atol=1e-5)
    for got, want in zip(out["heads"][1], out["rows"][1]):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    assert out["heads"][1][0]["k0"][positions[2]].any()  # slot 2's new row, moved into slot 0
