"""The torch module zoo: eager PyTorch vs torch.compile(backend="lightspeed") vs torch.compile's
default backend (inductor), on the CPU, in one run.

For each model it prints the median time of one forward call for the three, the compile time
(first call minus a steady call) of the two compilers, and the ratios. Not a test: timings
never fail anything.

    python benchmarks/torch_zoo.py [--models mlp,cnn,...] [--batch 4] [--seq 64] [--runs 20] [--dynamic]
                                   [--threads N] [--hidden 384 --layers 4]

``--hidden``/``--layers`` build the Llama, GPT-2 and BERT models at that width and depth (64-wide heads,
Llama with a third as many KV heads, FFN 4x hidden for GPT-2/BERT and 8/3x for Llama) instead of the test
suite's tiny ones. The last line is the geometric mean of inductor / Lightspeed over the models run.

``--threads`` sets both PyTorch's and Lightspeed's thread counts (on a busy machine, 1 thread
gives the least distorted comparison: oversubscribed thread pools degrade unevenly). ``--cpu-time``
(with ``--threads 1``) times the calling thread's CPU time instead of the wall clock, so time the machine
gives to other jobs is not counted; rounds then alternate eager, Lightspeed and inductor.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_torch_backend_zoo import ZOO, main_output  # noqa: E402


def _time_calls(fn, kwargs, runs: int, clock=time.perf_counter) -> float:
    times = []
    with torch.no_grad():
        for _ in range(runs):
            t0 = clock()
            main_output(fn(**kwargs))
            times.append(clock() - t0)
    return statistics.median(times)


def _alternating(fns: list, kwargs, runs: int, clock) -> list[float]:
    """Median time of one call of each of ``fns``, their calls alternating round by round."""
    times: list[list[float]] = [[] for _ in fns]
    with torch.no_grad():
        for fn in fns:  # a fresh torch.compile compiles on its first call
            main_output(fn(**kwargs))
        for _ in range(runs):
            for fn, ts in zip(fns, times):
                t0 = clock()
                main_output(fn(**kwargs))
                ts.append(clock() - t0)
    return [statistics.median(ts) for ts in times]


def _compile_and_time(model, kwargs, runs: int, **compile_kwargs) -> tuple[float, float, torch.Tensor]:
    torch._dynamo.reset()
    compiled = torch.compile(model, **compile_kwargs)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = main_output(compiled(**kwargs))
    first = time.perf_counter() - t0
    steady = _time_calls(compiled, kwargs, runs)
    return max(first - steady, 0.0), steady, out


def sized_transformers(hidden: int, layers: int) -> dict:
    """Builders of the Llama, GPT-2 and BERT models at ``hidden`` width and ``layers`` depth (random
    weights; the inputs are the test zoo's)."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    heads = max(1, hidden // 64)

    def llama():
        torch.manual_seed(3)
        cfg = LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=(8 * hidden // 3 + 63) // 64 * 64,
                          num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=max(1, heads // 3), max_position_embeddings=512,
                          attn_implementation="sdpa")
        return LlamaForCausalLM(cfg).eval(), ZOO["llama"]()[1]

    def gpt2():
        torch.manual_seed(4)
        cfg = GPT2Config(vocab_size=96, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=512,
                         bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
        return GPT2LMHeadModel(cfg).eval(), ZOO["gpt2"]()[1]

    def bert():
        torch.manual_seed(5)
        cfg = BertConfig(vocab_size=96, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=4 * hidden, max_position_embeddings=512, attn_implementation="sdpa")
        return BertModel(cfg).eval(), ZOO["bert"]()[1]
    return {"llama": llama, "gpt2": gpt2, "bert": bert}


def bench(name: str, batch: int, seq: int, runs: int, dynamic: bool, zoo: dict = ZOO, cpu_time: bool = False
          ) -> dict:
    model, make = zoo[name]()
    kwargs = make(batch, seq)
    with torch.no_grad():
        ref = main_output(model(**kwargs))
    eager = _time_calls(model, kwargs, runs)
    ls_compile, ls_time, ls_out = _compile_and_time(model, kwargs, runs, backend="lightspeed", dynamic=dynamic)
    ind_compile, ind_time, _ = _compile_and_time(model, kwargs, runs, dynamic=dynamic)
    if cpu_time:  # both compiled callables stay valid: dynamo keeps one cache entry per backend
        ls_fn = torch.compile(model, backend="lightspeed", dynamic=dynamic)
        ind_fn = torch.compile(model, dynamic=dynamic)
        eager, ls_time, ind_time = _alternating([model, ls_fn, ind_fn], kwargs, runs, time.thread_time)
    err = (ls_out.float() - ref.float()).abs().max().item()
    return {"model": name, "eager_ms": eager * 1e3, "lightspeed_ms": ls_time * 1e3, "inductor_ms": ind_time * 1e3,
            "lightspeed_compile_s": ls_compile, "inductor_compile_s": ind_compile, "max_abs_err": err}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64, help="sequence length (image size for the CNN)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dynamic", action="store_true", help="compile with dynamic=True")
    ap.add_argument("--threads", type=int, default=0, help="threads for PyTorch and Lightspeed (0: defaults)")
    ap.add_argument("--hidden", type=int, default=0, help="width of the transformer models (0: the tests' tiny ones)")
    ap.add_argument("--layers", type=int, default=4, help="their depth with --hidden (default 4)")
    ap.add_argument("--cpu-time", action="store_true", help="time thread CPU time (needs --threads 1)")
    args = ap.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time needs --threads 1 (other threads' work is not the calling thread's CPU time)")
    zoo = dict(ZOO)
    if args.hidden:
        zoo.update(sized_transformers(args.hidden, args.layers))
    warnings.filterwarnings("ignore")
    if args.threads:
        from lightspeed.backend.c import set_num_threads
        torch.set_num_threads(args.threads)
        set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, seq {args.seq}, "
          f"dynamic={args.dynamic}, {'thread CPU time' if args.cpu_time else 'wall time'}")
    head = (f"{'model':14s} {'eager ms':>9s} {'ls ms':>8s} {'ind ms':>8s} {'eager/ls':>9s} {'ind/ls':>7s} "
            f"{'ls comp s':>9s} {'ind comp s':>10s} {'max err':>8s}")
    print(head + (f"   (transformers: hidden {args.hidden}, {args.layers} layers)" if args.hidden else ""))
    ratios = []
    for name in args.models.split(","):
        try:
            r = bench(name, args.batch, args.seq, args.runs, args.dynamic, zoo, args.cpu_time)
        except Exception as e:  # noqa: BLE001  (report and continue with the next model)
            print(f"{name:14s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        print(f"{r['model']:14s} {r['eager_ms']:9.2f} {r['lightspeed_ms']:8.2f} {r['inductor_ms']:8.2f} "
              f"{r['eager_ms'] / r['lightspeed_ms']:9.2f} {r['inductor_ms'] / r['lightspeed_ms']:7.2f} "
              f"{r['lightspeed_compile_s']:9.1f} {r['inductor_compile_s']:10.1f} {r['max_abs_err']:8.1e}")
        ratios.append(r["inductor_ms"] / r["lightspeed_ms"])
    print("ratios > 1 mean Lightspeed is faster")
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        print(f"geometric mean inductor/lightspeed over {len(ratios)} models: {geo:.2f}x (lowest {min(ratios):.2f}x)")


if __name__ == "__main__":
    main()
