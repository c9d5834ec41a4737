"""Sampling cost per token: the candidate-set sampler (lightspeed.sampling) against the full-sort one it
replaced (tests/sampling_oracle.py), greedy and with the options chat clients send, at SmolLM2's and
Gemma 3's vocabulary sizes.

Each call samples from a different logits row with a history that grows by the drawn token, as decoding
does (the history is passed only with a repetition penalty, as the generation loop and the server do).
Rows are synthetic LM-like logits (tests/sampling_oracle.py: lm_like), or with ``--model`` the logits of
a real model's greedy chat reply (the default SmolLM2 when PATH is omitted; its own vocabulary size).
Prints min and median ms per token over the calls and the ratio old / new of each, measured back to back
in one run (> 1 means the new sampler is faster). ``--decode`` adds an A/B in the generation loop itself,
where the step has just evicted the caches, so sampling (greedy's included) costs several times more.

    python benchmarks/sampling.py [--calls 60] [--vocab 49152,262144] [--model [PATH] [--decode ROUNDS]] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from lightspeed.generate import Generation, KVCache  # noqa: E402
from lightspeed.sampling import Sampler, SamplingParams  # noqa: E402
from sampling_oracle import RefSampler, lm_like  # noqa: E402

OPTIONS = {
    "greedy": dict(),
    "chat (T 0.8, top-k 40, top-p 0.95, rep 1.1)": dict(temperature=0.8, top_k=40, top_p=0.95,
                                                        repetition_penalty=1.1),
    "T 0.8, top-p 0.95": dict(temperature=0.8, top_p=0.95),
    "T 0.8, min-p 0.05, rep 1.1": dict(temperature=0.8, min_p=0.05, repetition_penalty=1.1),
    "T 0.8": dict(temperature=0.8),
}


def time_sampler(sampler, rows: list[np.ndarray], prompt: list[int], calls: int) -> tuple[float, float]:
    """(min, median) seconds per call over ``calls`` calls, the history growing by each drawn token."""
    history = list(prompt)
    penalised = sampler.params.repetition_penalty != 1.0
    sampler(rows[0], history if penalised else ())                    # warm-up
    times = []
    for i in range(calls):
        x = rows[i % len(rows)]
        t = time.perf_counter()
        token = sampler(x, history if penalised else ())
        times.append(time.perf_counter() - t)
        history.append(token)
    return min(times), statistics.median(times)


class Recorder:
    """A greedy sampler that keeps a copy of every logits row it is given."""

    def __init__(self) -> None:
        self.inner = Sampler()
        self.params = self.inner.params
        self.rows: list[np.ndarray] = []

    def __call__(self, logits: np.ndarray, previous=()) -> int:
        self.rows.append(np.array(logits, dtype=np.float32).reshape(-1))
        return self.inner(logits, previous)


def load_model(path: str | None):
    """The model at ``path`` (the default SmolLM2 for None) and the token ids of the benchmark's prompt:
    a chat turn, or the plain prompt where the model has no chat template."""
    import lightspeed.api as lsa

    model = lsa.load(path, progress=False)
    prompt = "Write a short story about a robot who paints."
    try:
        return model, model.chat_ids(prompt)
    except ValueError:
        return model, model.prompt_ids(prompt)


def model_rows(model, ids: list[int], n: int = 64) -> list[np.ndarray]:
    """The next-token logits of ``n`` steps of a greedy reply to ``ids``."""
    gen = Generation(model.step, model.tokenizer, ids, max_tokens=n, stop_ids=[], cache=KVCache(model.step))
    gen.sampler = recorder = Recorder()
    gen.run()
    return recorder.rows


def decode_ab(model, ids: list[int], rounds: int, tokens: int = 64) -> list[dict]:
    """Greedy, the chat options with the new sampler and with the old one, in the generation loop, rounds
    interleaved: decode tokens/s counting sampling time (best and median round) and sampling ms per token."""
    chat = SamplingParams(seed=1, **OPTIONS["chat (T 0.8, top-k 40, top-p 0.95, rep 1.1)"])
    arms = {"greedy": (SamplingParams(), Sampler), "chat, new": (chat, Sampler), "chat, old": (chat, RefSampler)}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, (params, cls) in arms.items():
            gen = Generation(model.step, model.tokenizer, ids, params, max_tokens=tokens, stop_ids=[],
                             cache=KVCache(model.step))
            gen.sampler = cls(params)
            gen.run()
            st = gen.stats
            runs[name].append((st.decode_steps / (st.decode_seconds + st.sampling_seconds),
                               st.sampling_seconds / st.generated_tokens))
    greedy = statistics.median(r[0] for r in runs["greedy"])
    out = []
    for name, v in runs.items():
        speed, cost = [r[0] for r in v], [r[1] * 1e3 for r in v]
        out.append({"arm": name, "tok_s_max": max(speed), "tok_s_median": statistics.median(speed),
                    "vs_greedy_median": statistics.median(speed) / greedy,
                    "sampling_ms_min": min(cost), "sampling_ms_median": statistics.median(cost)})
    return out


def bench(rows: list[np.ndarray], calls: int, seed: int = 0) -> list[dict]:
    vocab = rows[0].size
    prompt = np.random.default_rng(seed).integers(0, vocab, 512).tolist()
    results = []
    for name, opt in OPTIONS.items():
        params = SamplingParams(seed=1, **opt)
        old = time_sampler(RefSampler(params), rows, prompt, calls)
        new = time_sampler(Sampler(params), rows, prompt, calls)
        results.append({"vocab": vocab, "options": name, "old_ms_min": old[0] * 1e3, "old_ms_median": old[1] * 1e3,
                        "new_ms_min": new[0] * 1e3, "new_ms_median": new[1] * 1e3,
                        "ratio_min": old[0] / new[0], "ratio_median": old[1] / new[1]})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=60, help="sampling calls per implementation and option set")
    ap.add_argument("--vocab", default="49152,262144", help="comma-separated vocabulary sizes")
    ap.add_argument("--model", nargs="?", const="", default=None, metavar="PATH",
                    help="sample from a real model's logits instead (default model when PATH is omitted)")
    ap.add_argument("--decode", type=int, default=0, metavar="ROUNDS",
                    help="with --model, also time the generation loop: greedy vs the chat options, old and new")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    decode = []
    if args.model is not None:
        model, ids = load_model(args.model or None)
        row_sets = [model_rows(model, ids)]
        if args.decode:
            decode = decode_ab(model, ids, args.decode)
    else:
        rng = np.random.default_rng(0)
        row_sets = [[lm_like(rng, int(v)) for _ in range(16)] for v in args.vocab.split(",")]
    results = [r for rows in row_sets for r in bench(rows, args.calls)]
    if args.json:
        print(json.dumps({"sampling": results, "decode": decode}, indent=1))
        return
    print(f"{'vocab':>7}  {'options':<44} {'old ms min/med':>16} {'new ms min/med':>16} {'old/new min/med':>16}")
    for r in results:
        print(f"{r['vocab']:>7}  {r['options']:<44} {r['old_ms_min']:>7.3f}/{r['old_ms_median']:<8.3f}"
              f"{r['new_ms_min']:>7.3f}/{r['new_ms_median']:<8.3f} {r['ratio_min']:>6.1f}x/{r['ratio_median']:.1f}x")
    if decode:
        print(f"\ngeneration loop, {args.decode} rounds: tok/s counting sampling (max/median, median vs greedy), "
              f"sampling ms/token (min/median)")
        for r in decode:
            print(f"  {r['arm']:<10} {r['tok_s_max']:7.1f}/{r['tok_s_median']:<7.1f} {r['vs_greedy_median']:5.2f}x   "
                  f"{r['sampling_ms_min']:.3f}/{r['sampling_ms_median']:.3f}")

if __name__ == "__main__":
    main()
