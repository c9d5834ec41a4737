"""Load test of ``lightspeed serve`` on loopback: scaling of batched decoding, sustained load, and (asked for)
the token gaps of running streams while a long prompt arrives and the prefix cache's time to first token.

    python benchmarks/serve_load.py                      # starts its own server (SmolLM2, --max-batch 8)
    python benchmarks/serve_load.py --duration 60 --clients 32 --json out.json
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --pid 1234   # an already running server

Two phases, both bounded in time:

1. scaling: ``--rounds`` times, one streaming client alone, then ``--streams`` clients at once,
   each generating ``--tokens`` tokens (greedy, ``ignore_eos``); decode tokens/s alone is counted
   from the stream's first token to its last (prefill excluded), and together as the tokens that
   arrive while every stream is decoding (from the last stream's first token to the first
   stream's last); the ratio together/alone is reported as min and median over the rounds (the
   machine is shared and noisy);
2. load: ``--clients`` clients send streaming chat requests back to back for ``--duration``
   seconds (requests still running then get ``--drain`` seconds more, then are cut off and
   counted apart); reports requests, failures (any non-200 or broken stream), latency p50/p99 (whole
   request) and time to first token, generated tokens/s, and the server's resident memory after
   warm-up and at the end (growth = end - warm-up).

3. ``--prefill`` (with ``--context`` >= 2048): ``--streams-during`` streams run, then one client sends a
   ``--long-tokens``-token prompt; reports the streams' median gap between tokens before it was sent, the
   median and max while it was prefilled, the p99 over the whole run (as a multiple of the median before)
   and the long prompt's time to its answer;
4. ``--prefix``: two chat requests sharing a ~1,200-token system prompt, one after the other; reports each
   one's time to first token and cached prompt tokens.

Not a test: it prints numbers and never fails on a timing. The exit code is 1 only when a
request failed or the server could not start.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time

import httpx

PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain how rainbows form.",
           "List ten fruits and one fact about each.", "What makes a good cup of coffee?",
           "Describe the city of Paris to someone who has never been there.", "How do airplanes fly?",
           "Give me a recipe for pancakes.", "Why is the sky blue?"]


def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "lightspeed", "serve", "--port", "0", "--max-batch", str(args.max_batch),
           "--context", str(args.context), "--max-queue", "256"]
    if args.model:
        cmd += ["--model", args.model]
    if args.quant:
        cmd += ["--quant", args.quant]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.prefill_chunk:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    if args.kv_cache:
        cmd += ["--kv-cache", args.kv_cache]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + args.start_timeout
    for line in proc.stderr:
        print(line.rstrip(), file=sys.stderr)
        m = re.search(r"on (http://\S+)/v1", line)
        if m:
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("the server did not start")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def stream_once(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, *,
                      ignore_eos: bool = False) -> dict:
    """One streaming chat request; timings and the number of content chunks (≈ tokens)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:  # every stream generates max_tokens (an extension vLLM has too)
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    first = last = None
    usage = None
    stamps: list[float] = []  # arrival time of each content chunk
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"ok": False, "status": r.status_code, "error": r.text[:200]}
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                return {"ok": False, "status": 200, "error": str(obj["error"])[:200]}
            if obj.get("usage"):
                usage = obj["usage"]
            if obj["choices"] and obj["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                stamps.append(now)
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else 0
    return {"ok": done, "status": 200, "latency": end - t0, "ttft": (first or end) - t0,
            "tokens": tokens, "decode_span": (last - first) if first and last else 0.0, "first": first, "last": last,
            "stamps": stamps}


async def scaling(url: str, model: str, args) -> dict:
    """Decode tokens/s of one stream alone vs ``args.streams`` at once, ``args.rounds`` times."""
    singles, multis = [], []
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=_auth(args)) as client:
        await stream_once(client, model, PROMPTS[0], 8)  # warm-up
        for _ in range(args.rounds):
            r = await stream_once(client, model, PROMPTS[0], args.tokens, ignore_eos=True)
            singles.append((r["tokens"] - 1) / r["decode_span"])
            rs = await asyncio.gather(*[stream_once(client, model, PROMPTS[i % len(PROMPTS)], args.tokens,
                                                    ignore_eos=True) for i in range(args.streams)])
            # every stream decoding at once: from the last first-token to the first last-token;
            # the chunks that arrived in that window (one token each, as the server streams them)
            start, end = max(x["first"] for x in rs), min(x["last"] for x in rs)
            tokens = sum(start < t <= end for x in rs for t in x["stamps"])
            multis.append(tokens / (end - start) if end > start else float("nan"))
            print(f"  round: single {singles[-1]:.1f} tok/s, {args.streams} streams {multis[-1]:.1f} tok/s, "
                  f"ratio {multis[-1] / singles[-1]:.2f}", file=sys.stderr)
    ratios = [m / s for m, s in zip(multis, singles)]
    return {"single_tok_s": singles, "concurrent_tok_s": multis, "streams": args.streams,
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios)}


def _auth(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


async def load(url: str, model: str, pid: int | None, args) -> dict:
    """``args.clients`` clients back to back for ``args.duration`` seconds."""
    results: list[dict] = []
    stop_at = time.monotonic() + args.duration
    warm_rss: list[int] = []

    async def client_loop(k: int, client: httpx.AsyncClient) -> None:
        i = k
        while time.monotonic() < stop_at:
            try:
                r = await stream_once(client, model, PROMPTS[i % len(PROMPTS)], args.load_tokens)
            except (httpx.HTTPError, json.JSONDecodeError) as e:
                r = {"ok": False, "status": None, "error": repr(e)[:200]}
            r["t"] = time.monotonic()
            results.append(r)
            i += args.clients

    async def sample_memory() -> None:
        await asyncio.sleep(min(args.warmup, args.duration / 3))
        if pid:
            warm_rss.append(rss_bytes(pid))

    limits = httpx.Limits(max_connections=args.clients + 4)
    t0 = time.monotonic()
    unfinished = 0
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, headers=_auth(args)) as client:
        tasks = [asyncio.ensure_future(client_loop(k, client)) for k in range(args.clients)]
        await sample_memory()
        # requests running at the deadline may finish within the drain time; the rest are cut off
        _, pending = await asyncio.wait(tasks, timeout=max(stop_at - time.monotonic(), 0) + args.drain)
        for t in pending:
            t.cancel()
        unfinished = len(pending)
        await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.monotonic() - t0
    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    lat = sorted(r["latency"] for r in ok)
    ttft = sorted(r["ttft"] for r in ok)

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    end_rss = rss_bytes(pid) if pid else 0
    out = {"clients": args.clients, "duration_s": round(elapsed, 1), "requests": len(results),
           "failures": len(failed), "cut_off_at_the_end": unfinished,
           "failure_examples": [r.get("error") or r.get("status") for r in failed[:3]],
           "latency_p50_s": pct(lat, 0.5), "latency_p99_s": pct(lat, 0.99), "ttft_p50_s": pct(ttft, 0.5),
           "ttft_p99_s": pct(ttft, 0.99), "tokens": sum(r["tokens"] for r in ok),
           "tokens_per_s": sum(r["tokens"] for r in ok) / elapsed}
    if pid:
        out.update(rss_warm_mb=round(warm_rss[0] / 2 ** 20, 1) if warm_rss else None,
                   rss_end_mb=round(end_rss / 2 ** 20, 1),
                   rss_growth_mb=round((end_rss - warm_rss[0]) / 2 ** 20, 1) if warm_rss else None)
    return out


async def prefill_gaps(url: str, model: str, args) -> dict:
    """Gaps between the tokens of running streams before and while a long prompt is prefilled."""
    sent: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=_auth(args)) as client:
        async def stream(i: int) -> list[float]:
            body = {"model": model, "prompt": f"Chapter {i + 1}. The", "max_tokens": args.context - 16,
                    "temperature": 0, "stream": True, "ignore_eos": True}
            stamps: list[float] = []
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        stamps.append(time.perf_counter())
                    if "answered" in sent and time.perf_counter() - sent["answered"] > 1.0:
                        break  # leaving the block closes the stream, which cancels the request
            return stamps

        tasks = [asyncio.ensure_future(stream(i)) for i in range(args.streams_during)]
        await asyncio.sleep(3.0)
        words = "the quiet river bends past old stone mills and green fields where children play "
        prompt = words * max(1, args.long_tokens // 15)
        sent["sent"] = time.perf_counter()
        r = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4,
                                                       "temperature": 0})
        sent["answered"] = time.perf_counter()
        runs = await asyncio.gather(*tasks)
    before = [b - a for s in runs for a, b in zip(s, s[1:]) if b < sent["sent"]]
    during = [b - a for s in runs for a, b in zip(s, s[1:]) if sent["sent"] <= a and b <= sent["answered"]]
    gaps = sorted(b - a for s in runs for a, b in zip(s, s[1:]))
    median = statistics.median(before)
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    out = {"streams": args.streams_during, "prompt_tokens": r.json()["usage"]["prompt_tokens"],
           "answer_s": round(sent["answered"] - sent["sent"], 2), "median_gap_before_ms": round(median * 1e3, 1),
           "median_gap_during_ms": round(statistics.median(during) * 1e3, 1) if during else None,
           "max_gap_during_ms": round(max(during) * 1e3, 1) if during else None,
           "p99_gap_ms": round(p99 * 1e3, 1), "p99_over_median": round(p99 / median, 2)}
    health = httpx.get(f"{url}/health", headers=_auth(args), timeout=30).json()
    out["prefill_chunk"] = health.get("prefill_chunk")
    print(f"  prefill: {out}", file=sys.stderr)
    return out


async def prefix_ttft(url: str, model: str, args) -> dict:
    """Time to first token of two chat requests sharing a long system prompt."""
    words = "Answer kindly, briefly and accurately; cite nothing; never invent facts about the world. "
    system = {"role": "system", "content": words * 85}
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=_auth(args)) as client:
        for question in ("Name a planet.", "Name a color."):
            body = {"model": model, "messages": [system, {"role": "user", "content": question}], "max_tokens": 8,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            first, usage = None, None
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    obj = json.loads(line[6:])
                    if obj.get("usage"):
                        usage = obj["usage"]
                    if obj["choices"] and obj["choices"][0]["delta"].get("content") and first is None:
                        first = time.perf_counter() - t0
            out.append({"ttft_s": round(first or float("nan"), 3), "prompt_tokens": usage["prompt_tokens"],
                        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]})
    print(f"  prefix: {out}", file=sys.stderr)
    return {"requests": out, "second_over_first": round(out[1]["ttft_s"] / out[0]["ttft_s"], 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--pid", type=int, default=None, help="the running server's process id (for its memory)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="model file for the server this script starts")
    p.add_argument("--quant", default=None)
    p.add_argument("--threads", type=int, default=None, help="--threads of the server this script starts")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--streams", type=int, default=8, help="concurrent streams in the scaling phase (8)")
    p.add_argument("--rounds", type=int, default=3, help="scaling rounds (3)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per stream in the scaling phase (64)")
    p.add_argument("--clients", type=int, default=32, help="clients in the load phase (32)")
    p.add_argument("--duration", type=float, default=60, help="seconds of the load phase (60)")
    p.add_argument("--warmup", type=float, default=15, help="seconds before the warm memory sample (15)")
    p.add_argument("--drain", type=float, default=60,
                   help="seconds requests running at the end of the load phase may take to finish (60)")
    p.add_argument("--load-tokens", type=int, default=32, help="max_tokens per request in the load phase (32)")
    p.add_argument("--prefill", action="store_true", help="measure streams' gaps while a long prompt arrives")
    p.add_argument("--streams-during", type=int, default=4, help="running streams in the --prefill phase (4)")
    p.add_argument("--long-tokens", type=int, default=1500, help="tokens of the --prefill phase's prompt (1500)")
    p.add_argument("--prefix", action="store_true", help="time to first token with a shared system prompt")
    p.add_argument("--prefill-chunk", default=None, help="--prefill-chunk of the server this script starts")
    p.add_argument("--kv-cache", default=None, choices=["f16", "f32"],
                   help="--kv-cache of the server this script starts (default: the server's, f16)")
    p.add_argument("--skip-scaling", action="store_true")
    p.add_argument("--skip-load", action="store_true")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    proc = None
    url, pid = args.url, args.pid
    if url is None:
        proc, url = start_server(args)
        pid = proc.pid
    try:
        models = httpx.get(f"{url}/v1/models", headers=_auth(args), timeout=30).json()["data"]
        model = models[0]["id"]
        report: dict = {"model": model, "url": url}
        if not args.skip_scaling:
            report["scaling"] = asyncio.run(scaling(url, model, args))
        if not args.skip_load:
            report["load"] = asyncio.run(load(url, model, pid, args))
        if args.prefill:
            report["prefill"] = asyncio.run(prefill_gaps(url, model, args))
        if args.prefix:
            report["prefix"] = asyncio.run(prefix_ttft(url, model, args))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if report.get("load", {}).get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
