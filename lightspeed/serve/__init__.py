"""``lightspeed serve``: an OpenAI-compatible HTTP server with streaming and batched decoding.

    lightspeed serve --model SmolLM2-135M-Instruct.Q4_1.gguf --max-batch 8 --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Hi", max_tokens=16)

Modules, in the order a request meets them:

- ``app``: the OpenAI routes and their response shapes (choices, logprobs, usage), error JSON;
- ``common``: what every endpoint shares: server state, auth, bounded body reads, the token budget;
- ``protocol``: strict validation of the request bodies;
- ``streams``: a request's ``n`` choices on the engine, server-sent events, cancelling on disconnect;
- ``logprobs``: how token log-probabilities are reported: the token texts and bytes, per endpoint;
- ``constraints``: response formats and tool calls (``lightspeed.structured``): grammars, prompts, replies;
- ``anthropic``: Anthropic's Messages API (``/v1/messages``) on the same engine, with its events and errors;
- ``server`` / ``cli``: loading, uvicorn, graceful shutdown, the ``serve`` subcommand.

The engine that runs the requests (scheduling, cache slots, batched steps, chunked prefill, prefix cache,
sampling under grammar masks) is ``lightspeed.engine``; nothing here builds a graph.

Nothing is imported here, so that ``lightspeed --help`` stays quick; import the modules.
"""
