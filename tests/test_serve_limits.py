"""``lightspeed serve`` limits that need a server of their own (a tiny random Llama, one slot, a
queue of one): 429 with Retry-After when the queue is full, and graceful shutdown on SIGTERM
(the in-flight stream finishes, new connections are refused, the process exits 0)."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_process import ServerProcess
from tiny_gguf import write_tiny_llama

LONG = 1800  # tokens of a stream that must outlast the checks made while it runs


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_limits") / "tiny.gguf"
    write_tiny_llama(path, seed=1)
    proc = ServerProcess(["--model", str(path), "--max-batch", "1", "--max-queue", "1", "--context", "2048",
                          "--shutdown-timeout", "60"])
    try:
        proc.wait_ready(timeout=300)
        yield proc
    finally:
        proc.stop()


def _health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=30).json()


def _wait(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _long_stream(url: str):
    body = {"model": "tiny", "prompt": "t1 t2", "max_tokens": LONG, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    return httpx.Client(base_url=url, timeout=120).stream("POST", "/v1/completions", json=body)


def test_queue_full_gets_429_with_retry_after(server) -> None:
    url = server.url
    results: dict = {}
    with _long_stream(url) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # running in the only slot
        queued = threading.Thread(target=lambda: results.setdefault(
            "queued", httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "t1", "max_tokens": 2},
                                 timeout=120)))
        queued.start()
        assert _wait(lambda: _health(url)["waiting"] == 1)
        refused = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "t2", "max_tokens": 2},
                             timeout=30)
        busy = _health(url)
    # the long stream was closed early: its slot frees and the queued request runs
    queued.join(timeout=60)
    assert busy["active"] == 1 and busy["waiting"] == 1
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    err = refused.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
    assert results["queued"].status_code == 200
    assert _wait(lambda: _health(url)["active"] == 0)


def test_sigterm_lets_the_stream_finish_and_refuses_new_connections(server) -> None:
    url = server.url
    with _long_stream(url) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        server.proc.terminate()  # SIGTERM
        refused = _wait(lambda: _refuses(url), timeout=20)
        still_running = server.proc.poll() is None
        events = [line[6:] for line in lines if line.startswith("data: ")]
    assert refused and still_running
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == LONG  # the in-flight request ran to its end
    assert server.wait_exit(60) == 0
    assert any("stopped" in line for line in server.log)


def _refuses(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False
