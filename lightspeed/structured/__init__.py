"""Structured output: generation constrained by a grammar, and tool calls.

The grammar engine is llguidance (PyPI ``llguidance``): a grammar (a JSON schema, a Lark grammar or a
regular expression) is compiled against the model's vocabulary, and before each token is sampled the
set of tokens that keep the output inside the grammar is computed as a bit mask; every other logit is
set to -inf, so whatever the sampler draws (greedy or with temperature) the text stays a prefix of a
sentence of the grammar, and the sequence ends when the grammar is complete.

Modules:

- ``vocab``: the bridge from a ``lightspeed.io.Tokenizer`` to llguidance's tokenizer;
- ``grammar``: grammar specifications, their limits and their compilation (``GrammarCompiler``);
- ``constraint``: one sequence's grammar state (mask the logits, consume the sampled token) and
  ``MaskWorker``, which computes the masks of a whole batch in parallel while the model runs;
- ``tools``: tool definitions, how they and tool calls are rendered into a chat, the grammar of a
  forced call, and parsing calls out of generated text (whole or streamed).

    from lightspeed.structured import GrammarCompiler, json_schema
    compiler = GrammarCompiler(model.tokenizer, model.config.vocab_size)
    grammar = compiler.compile(json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    constraint = grammar.new_constraint()
    logits = constraint.apply(logits)       # before sampling
    constraint.consume(token)               # after; constraint.finished when the grammar is complete
"""
from .constraint import Constraint, MaskWorker
from .grammar import (CompiledGrammar, GrammarCompiler, GrammarError, GrammarLimits, GrammarSpec, json_object,
                      json_schema, lark, regex)

__all__ = ["CompiledGrammar", "Constraint", "GrammarCompiler", "GrammarError", "GrammarLimits", "GrammarSpec",
           "MaskWorker", "json_object", "json_schema", "lark", "regex"]
