"""The serving engine: many sequences of one model advanced together, without HTTP.

    from lightspeed.engine.factory import build_engine
    from lightspeed.engine.sequence import RequestOptions, Sequence
    engine = build_engine(model, max_batch=8)           # model = lightspeed.api.load(...)
    engine.start()
    seq = Sequence(ids, RequestOptions(max_tokens=64), model.tokenizer, model.tokenizer.stop_ids, sink)
    engine.submit(seq)          # sink(kind, payload) hears its text, logprobs and end on the engine thread

Modules:

- ``scheduler``: ``Engine``, the one thread that owns every native call: it admits sequences into cache slots,
  prefills prompts in chunks between decode steps, runs the batched decode steps, prepares grammar masks
  while they run, reuses cached prompt prefixes (``lightspeed.prefix_cache``), queues and cancels;
- ``sequence``: one request's sampling, penalties, grammar mask, stop handling and incremental detokenizing;
- ``batched``: the batched decode step graph (one native call advances every active sequence);
- ``mixed``: the batched step that also carries a chunk of a prompt being prefilled (one pass over the weights);
- ``chunking``: how many prompt tokens a turn prefills while others decode;
- ``local``: an engine with one slot for ``lightspeed generate`` and ``chat`` (a chat's turns reuse the prefix
  cache);
- ``logprobs``: the log-probabilities a sequence records for its sampled tokens;
- ``factory``: ``build_engine``, an engine for a loaded model.

``lightspeed serve`` (``lightspeed.serve``) only speaks HTTP and hands its requests to this engine; ``generate``
and ``chat`` hand theirs to ``local.LocalEngine``. Nothing is
imported here, so that importing one module stays cheap.
"""
