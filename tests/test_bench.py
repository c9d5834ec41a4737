"""``lightspeed bench`` on a tiny GGUF model with a few tokens: the JSON report's fields and how
they relate, the bandwidth probe, the weight-bytes count, peers, the plot and the errors."""
from __future__ import annotations

import json
import sys

import pytest
from tiny_gguf import SHAPE, write_tiny_llama

from lightspeed import cli, quant
from lightspeed.bench import format_text, measure_read_bandwidth, plot, weight_bytes_per_token
from lightspeed.io import load_gguf

REQUIRED = ("model", "quant", "threads", "decode_tokens_per_s", "prefill_tokens_per_s", "bandwidth_gb_per_s",
            "limit_tokens_per_s", "percent_of_limit", "compile_s_cold", "compile_s_warm", "peak_rss_bytes", "peers")
PROMPT, DECODE, RUNS = 12, 5, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    write_tiny_llama(path, seed=1)
    return path


@pytest.fixture(scope="module")
def report(tiny):
    """One bench run: requantized to Q8_0 at load, with the peers that are installed."""
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["bench", "--model", str(tiny), "--threads", "1", "--prompt-tokens", str(PROMPT),
                       "--decode-tokens", str(DECODE), "--runs", str(RUNS), "--probe-reps", "2", "--quant", "q8_0",
                       "--peers", "--json", "--quiet"])
    assert rc == 0
    return json.loads(buf.getvalue())


def expected_q8_0_bytes() -> int:
    """Bytes of the tiny model with every matrix as Q8_0 (34 bytes per 32 values), norms as F32."""
    s, kv = SHAPE, SHAPE["hidden"] // SHAPE["heads"] * SHAPE["kv_heads"]
    per_layer = [(s["hidden"], s["hidden"]), (kv, s["hidden"]), (kv, s["hidden"]), (s["hidden"], s["hidden"]),
                 (s["ffn"], s["hidden"]), (s["ffn"], s["hidden"]), (s["hidden"], s["ffn"])]
    matrices = [(s["vocab"], s["hidden"])] + per_layer * s["layers"]
    norms = (2 * s["layers"] + 1) * s["hidden"] * 4
    return sum(r * c // 32 * 34 for r, c in matrices) + norms


def test_report_has_the_fields_and_they_agree(report, tiny):
    for key in REQUIRED:
        assert key in report, key
    assert report["model"] == str(tiny) and report["quant"] == "Q8_0" and report["threads"] == 1
    assert report["requantized_in_memory"] is True
    assert report["weight_bytes_per_token"] == expected_q8_0_bytes()  # tied embedding: read whole by the head
    assert set(report["weight_bytes_by_type"]) == {"Q8_0", "F32"}
    for key in ("decode", "prefill"):
        runs = report[f"{key}_runs"]
        assert len(runs) == RUNS and all(r > 0 for r in runs)
        assert min(runs) <= report[f"{key}_tokens_per_s"] <= max(runs) == report[f"{key}_tokens_per_s_best"]
    bw, per_token = report["bandwidth_gb_per_s"], report["weight_bytes_per_token"]
    assert 0.01 < bw < 10_000
    assert report["limit_tokens_per_s"] == pytest.approx(bw * 1e9 / per_token)
    assert report["effective_gb_per_s"] == pytest.approx(report["decode_tokens_per_s"] * per_token / 1e9)
    # each run against its own probe: the median percentage lies within the runs' extremes
    percents = [100 * d * per_token / 1e9 / b for d, b in zip(report["decode_runs"], report["bandwidth_runs_gb_per_s"])]
    assert min(percents) - 1e-9 <= report["percent_of_limit"] <= max(percents) + 1e-9
    # the cold compile ran the C compiler into an empty cache; the warm one found its result
    assert report["compile_s_cold"] > report["compile_s_warm"] > 0
    assert 10 * 2**20 < report["peak_rss_bytes"] < 8 * 2**30
    assert 0 < report["peak_rss_run_bytes"] <= report["peak_rss_bytes"]
    assert report["machine"]["cores"] >= 1 and report["date"]


def test_report_breaks_the_resident_memory_down(report):
    """lightspeed/bench/rss.py after the untimed run: the KV cache and the weights are named, the parts add up
    to at most the total, which is at most the run's peak (read a moment before)."""
    parts = report["rss_breakdown_bytes"]
    assert parts["kv_cache"] > 0 and parts["weights_huge_pages"] > 0 and parts["shared_libraries"] > 0
    assert parts["step_arena_size"] > 0
    named = sum(v for k, v in parts.items() if k not in ("total", "step_arena_size"))
    assert named <= parts["total"] <= report["peak_rss_run_bytes"] + (1 << 20)


def test_peers_report_ratios_or_why_they_were_skipped(report):
    assert set(report["peers"]) | set(report["peers_skipped"]) == {"llama.cpp", "pytorch", "pytorch-bf16"}
    for peer in report["peers"].values():
        assert peer["decode_tokens_per_s"] > 0 and peer["prefill_tokens_per_s"] > 0
        assert peer["lightspeed_decode_ratio"] == pytest.approx(report["decode_tokens_per_s"]
                                                                / peer["decode_tokens_per_s"])
        assert peer["lightspeed_prefill_ratio"] == pytest.approx(report["prefill_tokens_per_s"]
                                                                 / peer["prefill_tokens_per_s"])
    for why in report["peers_skipped"].values():
        assert why
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return
    for name in ("pytorch", "pytorch-bf16"):
        assert name in report["peers"], report["peers_skipped"].get(name)


def test_text_report_names_every_engine(report):
    text = format_text(report)
    assert "lightspeed" in text and "limit" in text and "% of the limit" in text
    for name in list(report["peers"]) + list(report["peers_skipped"]):
        assert name in text


def test_plot_writes_a_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    plot(report, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(report, tmp_path, monkeypatch, capsys, tiny):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(RuntimeError, match="pip install matplotlib"):
        plot(report, str(tmp_path / "x.png"))
    assert cli.main(["bench", "--model", str(tiny), "--plot", str(tmp_path / "x.png"), "--quiet"]) == 1
    assert "matplotlib" in capsys.readouterr().err


def test_probe_times_every_pass():
    bw = measure_read_bandwidth(8 << 20, threads=2, reps=3)
    assert len(bw.seconds) == 3 and all(t > 0 for t in bw.seconds)
    assert bw.best_gb_per_s >= bw.median_gb_per_s > 0.01
    with pytest.raises(ValueError, match="reps"):
        measure_read_bandwidth(1 << 20, threads=1, reps=0)


def test_weight_bytes_count_one_embedding_row_when_the_head_is_separate(tmp_path):
    path = tmp_path / "untied.gguf"
    write_tiny_llama(path, untied=True)
    tensors = load_gguf(path).tensors
    total = sum(t.n_bytes for t in tensors.values())
    embd = tensors["token_embd.weight"]
    row = quant.block_format(embd.qtype).row_bytes(SHAPE["hidden"])
    assert weight_bytes_per_token(tensors) == total - embd.n_bytes + row
    tied = {k: v for k, v in tensors.items() if k != "output.weight"}
    assert weight_bytes_per_token(tied) == sum(t.n_bytes for t in tied.values())


def test_bench_errors(tiny, tmp_path, capsys):
    assert cli.main(["bench", "--model", str(tmp_path / "none.gguf"), "--quiet"]) == 1
    assert "none.gguf" in capsys.readouterr().err
    assert cli.main(["bench", "--model", str(tiny), "--prompt-tokens", "0", "--quiet"]) == 1
    assert "prompt tokens" in capsys.readouterr().err
    assert cli.main(["bench", "--model", str(tiny), "--prompt-tokens", "250", "--decode-tokens", "10",
                     "--quiet"]) == 1
    assert "context of 256" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--quant", "q3_k"])


def test_quantized_activations_reach_the_compiled_step_from_bench_and_generate(tiny, capsys):
    """``--activations int16`` (and ``--int8-activations``, the older spelling of ``--activations int8``)
    compile the quantized matmuls with an activation scratch (bench reports the mode; generate runs with
    it); ``--threads`` sets the pool size and rejects 0."""
    import io
    from contextlib import redirect_stdout

    from lightspeed import api
    from lightspeed.backend.c import get_num_threads, set_num_threads
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["bench", "--model", str(tiny), "--threads", "1", "--prompt-tokens", "4", "--decode-tokens", "2",
                       "--runs", "1", "--probe-reps", "1", "--activations", "int16", "--json", "--quiet"])
    assert rc == 0
    r = json.loads(buf.getvalue())
    assert r["activations"] == "int16" and r["options"]["activations"] == "int16"
    assert "int16 activations" in format_text(r)
    with_int16 = api.load(str(tiny), ctx=32, progress=False, activations="int16")
    plain = api.load(str(tiny), ctx=32, progress=False, activations="float")  # the default is "auto"
    scratch = [k for k in with_int16.step.program.executor.plan.kernels if k.kind == "qmatmul" and k.scratch]
    assert scratch and all(k.template.activations == "int16" for k in scratch)
    assert not [k for k in plain.step.program.executor.plan.kernels if k.scratch]
    old = get_num_threads()
    try:
        assert cli.main(["generate", "--model", str(tiny), "--ctx", "32", "--max-tokens", "3", "--threads", "1",
                         "--int8-activations", "--json", "hi"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert len(out["token_ids"]) == 3 and get_num_threads() == 1
        assert cli.main(["generate", "--model", str(tiny), "--threads", "0", "hi"]) == 1
        assert "--threads" in capsys.readouterr().err
    finally:
        set_num_threads(old)
