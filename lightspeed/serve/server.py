"""Load a model, start the engine and run the HTTP server under uvicorn until SIGTERM/SIGINT.

Shutdown is graceful: on the first SIGTERM (or Ctrl-C) the listening socket closes (new
connections are refused), requests that reach the engine afterwards get 503, and in-flight
requests run to the end for up to ``shutdown_timeout`` seconds; then the engine stops.

Connections are bounded (``ServeOptions``): a request head must arrive within ``header_timeout``
seconds of connecting (or of its first byte after a response), its body within ``body_timeout`` of
the head (else 408), an idle keep-alive connection closes after ``keep_alive_timeout``, heads are
capped at ``max_header_bytes`` and beyond ``max_connections`` open connections requests get 503. A
client that half-closes after sending its request still gets the response (``bounded_protocol``).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass

from ..engine.factory import build_engine
from ..engine.scheduler import DEFAULT_PREFILL_CHUNK
from ..parallel.pipeline_serving import pipeline_engine
from ..io.template_limits import TemplateLimits
from ..structured import GrammarLimits


@dataclass
class ServeOptions:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    quant: str | None = None
    max_batch: int = 8
    context: int | None = None
    api_key: str | None = None
    max_queue: int = 64
    max_body_bytes: int = 1 << 20
    embed_model: str | None = None       # a BERT folder, or "default" for all-MiniLM-L6-v2
    name: str | None = None              # the model id clients use (default: the file or folder name)
    shutdown_timeout: float = 30.0
    log_level: str = "warning"
    backend: str = "c"
    threads: int | None = None           # threads of the C backend's pool (None: one per core)
    activations: str = "float"           # quantized matmuls' activations: float, int16 or int8 (faster, not bit-exact)
    kv_cache: str | None = None          # the KV caches' element type: f16, f32 (None: the backend's default)
    # connection limits: a client that sends nothing, trickles its headers or body, or idles between
    # requests is disconnected; beyond max_connections open connections new requests get 503
    header_timeout: float = 10.0         # seconds from connecting (or the first byte after a response) to a full head
    body_timeout: float = 30.0           # seconds from the request head to its last body byte (then 408)
    keep_alive_timeout: int = 5          # seconds an idle keep-alive connection stays open
    max_connections: int = 256
    max_header_bytes: int = 16 * 1024    # a longer request head is refused (400) as it arrives
    template_seconds: float = 5.0        # wall-clock bound of one chat-template render
    max_schema_bytes: int = 32 * 1024    # a response_format schema or grammar, or a request's tool schemas
    prefix_cache_mb: int = 256           # KV rows of shared prompt prefixes kept for reuse (0: no prefix cache)
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK  # prompt tokens per step while others decode (None: auto)
    tensor_parallel: int = 1             # ranks of a tensor-parallel group this process is rank 0 of
    pipeline_parallel: int = 1           # stages of a pipeline-parallel group this process is rank 0 of
    micro_batches: int | None = None     # a pipeline's micro-batches per decode step (None: one per stage)


def model_name(path: str) -> str:
    """A model id from a path: the file name without ``.gguf``, or the folder name (its parent's
    when the folder is just called ``model``)."""
    path = os.path.normpath(path)
    base = os.path.basename(path)
    if base == "model":
        base = os.path.basename(os.path.dirname(path)) or base
    return base.removesuffix(".gguf")


def _log(message: str) -> None:
    print(f"lightspeed serve: {message}", file=sys.stderr, flush=True)


def build_state(opts: ServeOptions):
    """Load and compile everything; returns the ``ServerState`` (its engine started)."""
    from ..api import load
    from ..cli_generate import activation_options, kv_cache_options
    from .app import ServerState
    if opts.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {opts.max_batch}")
    if opts.threads is not None and opts.backend == "c":
        from ..backend.c import set_num_threads
        set_num_threads(opts.threads)
    t0 = time.perf_counter()
    options = activation_options(opts.activations)
    model = load(opts.model, ctx=opts.context, quant=opts.quant, backend=opts.backend, progress=False, **options,
                 **kv_cache_options(opts.kv_cache), tensor_parallel=opts.tensor_parallel,
                 pipeline_parallel=opts.pipeline_parallel)
    _log(f"loaded {model.path} in {time.perf_counter() - t0:.1f} s (context {model.step.ctx} tokens)")
    if opts.pipeline_parallel > 1:  # stage 0 of a pipeline: its calls mirrored on the other stages
        engine = pipeline_engine(model, opts.max_batch, backend=opts.backend, options=options,
                                 prefill_chunk=opts.prefill_chunk, max_queue=opts.max_queue,
                                 micro_batches=opts.micro_batches, log=_log)
    else:
        engine = build_engine(model, opts.max_batch, backend=opts.backend, options=options,
                              prefix_cache_mb=opts.prefix_cache_mb, prefill_chunk=opts.prefill_chunk,
                              max_queue=opts.max_queue, log=_log)
    embedder, embed_id = None, None
    if opts.embed_model:
        from ..embed import default_embedder_path, load_embedder
        path = default_embedder_path() if opts.embed_model == "default" else opts.embed_model
        embedder = load_embedder(path, backend=opts.backend)
        embed_id = "all-MiniLM-L6-v2" if opts.embed_model == "default" else model_name(path)
        _log(f"embedding model {embed_id} ({embedder.dim} dimensions)")
    engine.start()
    return ServerState(model=model, model_id=opts.name or model_name(model.path), engine=engine,
                       embedder=embedder, embed_id=embed_id, api_key=opts.api_key,
                       max_body_bytes=opts.max_body_bytes, body_timeout_s=opts.body_timeout,
                       template_limits=TemplateLimits(max_seconds=opts.template_seconds),
                       grammar_limits=GrammarLimits(max_source_bytes=opts.max_schema_bytes))


def check_limits(opts: ServeOptions) -> None:
    """ValueError naming the first connection limit that is not positive."""
    for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "max_connections", "max_header_bytes",
                 "template_seconds", "max_schema_bytes"):
        value = getattr(opts, name)
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if opts.prefill_chunk is not None and not opts.prefill_chunk >= 1:
        raise ValueError(f"prefill_chunk must be >= 1, got {opts.prefill_chunk!r}")
    if not opts.prefix_cache_mb >= 0:
        raise ValueError(f"prefix_cache_mb must be >= 0, got {opts.prefix_cache_mb!r}")


def bounded_protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol with a deadline on every request head and half-close support.

    uvicorn bounds the idle time between requests (``timeout_keep_alive``) but not the time a client
    takes to send a request head: a connection that sends nothing, or a byte every few seconds, would
    stay open for ever. Here a timer starts when the connection opens, and again at the first byte after
    a response, and closes the connection unless a complete head has arrived by then.

    uvicorn also closes the connection when the client shuts down its sending side (EOF), so a client
    that half-closes after its request never gets the answer. Here, once a request has fully arrived,
    EOF keeps the connection open until the response is written, then closes it. The cost: a client that
    closes completely while a non-streaming request runs is noticed only when its response is written
    (a stream is cancelled at its next write); both look the same (a FIN) until the server writes.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _peer_done = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a request head was parsed
                self._cancel_head_timer()
            elif self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm_head_timer()  # bytes of a next request: its head has header_timeout to arrive

        def eof_received(self) -> bool | None:
            if self.cycle is not None and not self.cycle.more_body and not self.cycle.response_complete:
                self._peer_done = True  # the request is complete: answer it, then close
                return True
            return None  # closes the connection (uvicorn's behaviour)

        def on_response_complete(self) -> None:
            if self._peer_done:
                self.server_state.total_requests += 1
                self.transport.close()
                return
            super().on_response_complete()

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

    return BoundedH11Protocol


def serve(opts: ServeOptions) -> int:
    """Run the server until it is told to stop; the exit code."""
    import uvicorn

    from .app import create_app

    check_limits(opts)
    state = build_state(opts)
    engine = state.engine

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which also tells the engine to refuse new work on the first signal."""

        def handle_exit(self, sig, frame) -> None:
            engine.drain()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn re-raises the signal it caught once it has shut down, which kills the process
            # before the engine stops; after a graceful shutdown we exit normally (status 0) instead
            with super().capture_signals():
                yield
                getattr(self, "_captured_signals", []).clear()

    family = socket.AF_INET6 if ":" in opts.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((opts.host, opts.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(create_app(state), log_level=opts.log_level, access_log=False,
                            timeout_graceful_shutdown=max(int(opts.shutdown_timeout), 1), lifespan="off",
                            http=bounded_protocol(opts.header_timeout), timeout_keep_alive=opts.keep_alive_timeout,
                            limit_concurrency=opts.max_connections,
                            h11_max_incomplete_event_size=opts.max_header_bytes)
    server = DrainingServer(config)
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    auth = " (API key required)" if opts.api_key else ""
    _log(f"serving {state.model_id} on http://{shown}:{port}/v1{auth}")
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop(timeout=opts.shutdown_timeout)
        sock.close()
    _log("stopped")
    return 0

