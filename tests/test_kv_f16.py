"""A float16 KV cache (``kv_dtype="float16"``, CLI ``--kv-cache f16``: the C backend's default) on a tiny random
Llama, against the float32 one (``kv_dtype="float32"``, ``--kv-cache f32``).

New key/value rows are cast to float16 when appended and read back through a cast to float32, so
the C program must match the reference interpreter on the same graph, and stay close to the
float32-cache program. The streaming attention kernel must still be the one that runs, reading the
float16 rows in place (F16C where the target has it, a portable conversion otherwise). The prefill
here (5 tokens x 2 query heads per KV head) takes the many-rows path, the decode steps the few-rows one.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_gguf import SHAPE, write_tiny_llama

from lightspeed import api, cli, cli_generate
from lightspeed.backend.c.compiler import default_flags
from lightspeed.backend.c.render import PRELUDE
from lightspeed.models import load_model

CTX = 24
TOKENS = [3, 17, 42, 5, 88, 61, 0, 96, 23, 23, 7, 50]
SPLIT = 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("kvf16") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return path


@pytest.fixture(scope="module")
def lm(tiny, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_kvf16"))
    yield load_model(tiny)
    mp.undo()


def run_all(step) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits of a prefill of TOKENS[:SPLIT], then of one-token decode steps; and the final caches."""
    logits, caches = step.run(TOKENS[:SPLIT], 0, step.new_caches())
    out = [logits]
    for p in range(SPLIT, len(TOKENS)):
        logits, caches = step.run(TOKENS[p:p + 1], p, caches)
        out.append(logits)
    return np.concatenate(out), caches


@pytest.fixture(scope="module")
def f32_run(lm):
    """The float32-cache program (rows mode): (step, logits, caches) of ``run_all``."""
    step = compile_step(lm, kv_dtype="float32")
    return (step, *run_all(step))


def compile_step(lm, backend="c", kv_update="rows", kv_dtype="float16", **options):
    if backend == "c":  # float activations: the bounds below compare float32 arithmetic with the reference's
        options.setdefault("activations", "float")
    return lm.compile(CTX, max_chunk=8, last_only=False, backend=backend, kv_update=kv_update, kv_dtype=kv_dtype,
                      **options)


@pytest.mark.parametrize("kv_update", ["rows", "scatter"])
def test_f16_cache_matches_the_reference_and_stays_close_to_f32(lm, f32_run, kv_update):
    c16 = compile_step(lm, kv_update=kv_update)
    got, caches = run_all(c16)
    want, ref_caches = run_all(compile_step(lm, "reference", kv_update))
    # float32 arithmetic in another order (~1e-6) may round a key or value to the neighbouring float16
    # (one ulp, ~1e-3 relative), which later layers and steps carry on: measured up to 8e-4 on logits of
    # ~6 (seeds 3-5), against 3e-3 to 6e-3 between the float16 and float32 caches
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)
    _, f32, caches32 = f32_run
    # the caches really are float16: half the bytes, the same rows as the reference's
    assert all(a.dtype == np.float16 for a in caches.values()) and len(caches) == 2 * SHAPE["layers"]
    for name, a in caches.items():
        assert a.nbytes * 2 == caches32[name].nbytes
        np.testing.assert_allclose(a[:len(TOKENS)].astype(np.float32), ref_caches[name][:len(TOKENS)],
                                   rtol=4e-3, atol=2e-3)
    # layer 0's rows depend on the tokens alone: the float32 cache's rows rounded (within one f16 ulp)
    for name in ("k0", "v0"):
        np.testing.assert_allclose(caches[name][:len(TOKENS)].astype(np.float32), caches32[name][:len(TOKENS)],
                                   rtol=1e-3, atol=1e-5)
    diff = np.abs(got - f32).max()
    assert 0 < diff < 2e-2 * np.abs(f32).max(), diff  # rounded, but only by float16's precision
    # the lowered streaming attention runs (one per layer), reading float16 rows in place
    kernels = c16.program.executor.plan.kernels
    assert [k.kind for k in kernels].count("attention") == SHAPE["layers"]
    src = c16.program.executor.source
    assert "ls_load8h(kph" in src and "ls_load8h(vph" in src  # decode: few query rows
    assert "ls_load8h(kph[j8 + 0] + d0)" in src and "ls_load8h(src + e0)" in src  # prefill: keys/values staged


def test_portable_conversion_without_f16c(lm):
    """Without F16C the float16 rows are widened one by one: the same values (the conversion is exact)."""
    f16c = run_all(compile_step(lm))[0]
    flags = default_flags() + ["-mno-f16c"]
    portable = run_all(compile_step(lm, flags=flags, plan_cache=False))[0]
    np.testing.assert_array_equal(portable, f16c)


def test_f16_is_the_default_f32_is_kept_when_asked_and_bad_types_are_refused(lm, f32_run):
    step = f32_run[0]
    assert step.kv_dtype == "float32" and all(a.dtype == np.float32 for a in step.new_caches().values())
    assert step.program.executor.source.count("ls_load8h(") == PRELUDE.count("ls_load8h(")  # only its definition
    assert lm.build(CTX)[2][0].dtype.name == "float16"  # the default
    default = lm.compile(CTX, max_chunk=8)
    assert default.kv_dtype == "float16" and all(a.dtype == np.float16 for a in default.new_caches().values())
    assert lm.compile(CTX, max_chunk=8, backend="reference").kv_dtype == "float16"  # checks what C computes
    with pytest.raises(ValueError, match="kv_dtype"):
        lm.compile(CTX, kv_dtype="int8")


def test_api_cli_and_batched_step(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path / "cache"))
    parser = cli.build_parser()
    for command in (["generate", "x"], ["chat"], ["bench"], ["serve"], ["perplexity", "x"]):
        for value in ("f16", "f32"):
            assert parser.parse_args(command[:1] + ["--kv-cache", value] + command[1:]).kv_cache == value
        assert parser.parse_args(command).kv_cache is None  # unset: the backend's default
    assert cli_generate.kv_cache_name(None) == "f16" and cli_generate.kv_cache_name(None, "opencl") == "f32"
    assert cli_generate.kv_cache_options(None) == {} and cli_generate.kv_cache_options("f32") == {"kv_dtype": "float32"}
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--kv-cache", "f8", "x"])
    capsys.readouterr()

    # float activations, as the batched step below has (the models' default takes int16 for decode)
    # the default: float16; position-major caches, which serve's batched step shares (below); the CLI's
    # head-major ones give the same text
    model = api.load(str(tiny), ctx=32, progress=False, activations="float", kv_update="rows")
    assert model.step.kv_dtype == "float16" and all(a.dtype == np.float16 for a in model.cache.arrays.values())
    greedy = model.generate_text("hi", max_tokens=4)
    for flag in ([], ["--kv-cache", "f16"]):
        assert cli.main(["generate", "--model", str(tiny), "--ctx", "32", "--max-tokens", "4", *flag,
                         "--activations", "float", "--json", "hi"]) == 0
        assert json.loads(capsys.readouterr().out)["text"] == greedy
    f32 = api.load(str(tiny), ctx=32, progress=False, kv_dtype="float32", activations="float")
    assert f32.step.kv_dtype == "float32" and all(a.dtype == np.float32 for a in f32.cache.arrays.values())

    # serve's batched step shares the float16 caches with the single-sequence program
    from lightspeed.engine.batched import BatchedStep
    batched = BatchedStep(model.lm, 32, 2, head_major=False)  # float16, the default, as the program's
    assert all(a.dtype == np.float16 for a in batched.caches.values())
    assert [k.kind for k in batched.program.executor.plan.kernels].count("attention") == SHAPE["layers"]
    alone = {n: np.zeros_like(a[:32]) for n, a in batched.caches.items()}
    for slot in (0, 1):
        model.step.run(TOKENS[:SPLIT + slot], 0, batched.slot_caches(slot))
    model.step.run(TOKENS[:SPLIT], 0, alone)
    logits = batched.run([TOKENS[SPLIT], TOKENS[SPLIT + 1]], [SPLIT, SPLIT + 1])
    want, alone = model.step.run(TOKENS[SPLIT:SPLIT + 1], SPLIT, alone)
    np.testing.assert_allclose(logits[0], want[-1], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(batched.slot_caches(0)["k1"][SPLIT], alone["k1"][SPLIT])


def test_gpu_backends_keep_f32_by_default_and_read_f16_caches(lm, f32_run):
    """The GPU backends default to float32 caches (float16's speed there is not measured) and take float16 ones
    when asked: on OpenCL (PoCL where there is no GPU) the same tokens as the C program's float16 cache."""
    from lightspeed.backend.opencl import unavailable_reason
    from lightspeed.models.base import default_kv_dtype
    assert default_kv_dtype("cuda") == default_kv_dtype("opencl") == "float32" and default_kv_dtype() == "float16"
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no OpenCL device: {reason}")
    assert compile_step(lm, "opencl", kv_dtype=None).kv_dtype == "float32"
    got, caches = run_all(compile_step(lm, "opencl"))
    want, _ = run_all(compile_step(lm))
    assert all(a.dtype == np.float16 for a in caches.values())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)  # float32 sums in another order, as above
