"""``lightspeed serve``: an OpenAI-compatible HTTP server with streaming and batched decoding.

    lightspeed serve --model SmolLM2-135M-Instruct.Q4_1.gguf --max-batch 8 --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Hi", max_tokens=16)

Modules, in the order a request meets them:

- ``app``: the FastAPI routes, SSE streaming, auth, body limits, OpenAI error JSON;
- ``protocol``: strict validation of the request bodies;
- ``engine``: the scheduler thread that owns every native call (prefill chunks, batched steps,
  embeddings), packs sequences into cache slots, queues and cancels;
- ``sequence``: one request's sampling, stop handling and incremental detokenizing;
- ``batched``: the batched decode step graph (one native call advances every active sequence);
- ``server`` / ``cli``: loading, uvicorn, graceful shutdown, the ``serve`` subcommand.

Nothing is imported here, so that ``lightspeed --help`` stays quick; import the modules.
"""
