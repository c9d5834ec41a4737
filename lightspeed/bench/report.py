"""Presenting a benchmark report: a text table for people, a bar chart (matplotlib, optional)."""
from __future__ import annotations

import os
from typing import Any

from .pipeline_parallel import format_stage_rows
from .tensor_parallel import format_rows


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def format_text(r: dict[str, Any]) -> str:
    """A readable summary of ``run_bench``'s report."""
    m = r["machine"]
    how = f"requantized to {r['quant']} in memory" if r["requantized_in_memory"] else r["quant"]
    if r.get("activations") in ("int16", "int8"):
        how += f", {r['activations']} activations"
    if r.get("kv_cache"):
        how += f", {r['kv_cache']} KV cache"
    lines = [
        f"model    {os.path.basename(r['model'])} ({how}; {_mb(r['weight_bytes_per_token'])} of weights read "
        f"per token)",
        f"machine  {m['cpu']} ({', '.join(m['features']) or 'no AVX2'}), {r['threads']} "
        f"thread{'s' if r['threads'] != 1 else ''}; {r['date']}",
        f"work     prefill {r['prompt_tokens']} tokens, then decode {r['decode_tokens']} tokens; "
        f"{r['runs']} runs (median, best)",
        "",
        f"{'engine':<12} {'decode tok/s':>22} {'prefill tok/s':>24} {'lightspeed ratio':>26}",
    ]

    def row(name: str, d: dict, ratio: str = "") -> str:
        dec = f"{d['decode_tokens_per_s']:.1f} ({d['decode_tokens_per_s_best']:.1f})"
        pre = f"{d['prefill_tokens_per_s']:.1f} ({d['prefill_tokens_per_s_best']:.1f})"
        return f"{name:<12} {dec:>22} {pre:>24} {ratio:>26}"

    lines.append(row("lightspeed", r))
    for name, p in r["peers"].items():
        ratio = f"{p['lightspeed_decode_ratio']:.2f}x dec, {p['lightspeed_prefill_ratio']:.2f}x pre"
        lines.append(row(name, p, ratio))
    lines.append(f"{'limit':<12} {r['limit_tokens_per_s']:>22.1f}")
    for name, why in r["peers_skipped"].items():
        lines.append(f"{name:<12} skipped: {why}")
    lines += [
        "",
        f"bandwidth  {r['bandwidth_gb_per_s']:.1f} GB/s read ({_mb(r['weight_bytes_per_token'])} buffer, "
        f"{r['threads']} threads, median of the runs' best passes) -> limit {r['limit_tokens_per_s']:.1f} tok/s",
        f"decode     {r['effective_gb_per_s']:.1f} GB/s effective = {r['percent_of_limit']:.1f}% of the limit",
        f"compile    cold {r['compile_s_cold']:.2f} s, warm {r['compile_s_warm']:.2f} s (load {r['load_s']:.2f} s)",
        f"memory     peak RSS {_mb(r['peak_rss_bytes'])} ({r['peak_rss_scope']})"
        + (f", {_mb(r['peak_rss_run_bytes'])} during a run" if r.get("peak_rss_run_bytes") else "")
        + f"; model file {_mb(r['model_file_bytes'])}",
    ]
    parts = r.get("rss_breakdown_bytes")
    if parts:  # lightspeed/bench/rss.py: resident memory right after a run, by kind
        shown = [(k, v) for k, v in parts.items() if k not in ("total", "step_arena_size")]
        lines.append("resident   " + ", ".join(f"{k.replace('_', ' ')} {_mb(v)}" for k, v in shown)
                     + f" (of {_mb(parts['total'])}; the step's arena is {_mb(parts['step_arena_size'])})")
    for name, label in r["engines"].items():
        rev = f" (source {r['lightspeed_revision']})" if name == "lightspeed" and r.get("lightspeed_revision") else ""
        lines.append(f"engine     {name}: {label}{rev}")
    if "tensor_parallel" in r:  # lightspeed bench --tensor-parallel N
        lines += format_rows(r["tensor_parallel"])
    if "pipeline_parallel" in r:  # lightspeed bench --pipeline-parallel N
        lines += format_stage_rows(r["pipeline_parallel"])
    return "\n".join(lines)


def plot(r: dict[str, Any], path: str) -> None:
    """Bar charts of decode and prefill tokens/s (Lightspeed, peers; the limit for decode) into ``path``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
    names = ["lightspeed"] + list(r["peers"])
    rows = [r] + [r["peers"][n] for n in names[1:]]
    fig, (ax_dec, ax_pre) = plt.subplots(1, 2, figsize=(10, 4.2))
    dec_names, dec = names + ["limit"], [x["decode_tokens_per_s"] for x in rows] + [r["limit_tokens_per_s"]]
    bars = ax_dec.bar(dec_names, dec, color=["C0"] + ["C1"] * (len(names) - 1) + ["0.6"])
    ax_dec.bar_label(bars, fmt="%.3g")
    ax_dec.set_title(f"decode, {r['decode_tokens']} tokens")
    ax_dec.set_ylabel("tokens/s (median)")
    bars = ax_pre.bar(names, [x["prefill_tokens_per_s"] for x in rows], color=["C0"] + ["C1"] * (len(names) - 1))
    ax_pre.bar_label(bars, fmt="%.3g")
    ax_pre.set_title(f"prefill, {r['prompt_tokens']} tokens")
    threads = f"{r['threads']} thread" + ("s" if r["threads"] != 1 else "")
    fig.suptitle(f"{os.path.basename(r['model'])} as {r['quant']}, {threads}, {r['machine']['cpu']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
