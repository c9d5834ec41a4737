"""Grammar specifications, their limits, and their compilation against a model's vocabulary.

A ``GrammarSpec`` says what the output must be:

- ``json_object()``: any JSON object;
- ``json_schema(schema)``: JSON satisfying a JSON schema (the subset llguidance implements: types,
  properties/required/additionalProperties, items, enum/const, anyOf/oneOf/allOf, $ref/$defs,
  string lengths, patterns and formats, number bounds; ``not`` and a few others are refused);
- ``lark(text)``: a context-free grammar in llguidance's Lark syntax (``start: ...``; terminals are
  quoted strings or /regexes/; ``%json {schema}`` embeds a JSON schema);
- ``regex(text)``: text matching a regular expression (Rust ``regex`` syntax, anchored at both ends).

JSON is generated without free whitespace, with ``", "`` and ``": "`` as separators (a schema's
``x-guidance`` object may change that), so a schema with bounded strings and arrays has bounded output.

``GrammarCompiler.compile`` checks a spec against ``GrammarLimits`` (the size of the schema or grammar
text) and llguidance's own resource limits, and returns a ``CompiledGrammar`` whose
``new_constraint()`` gives each sequence its own state. Every problem is a ``GrammarError`` naming it.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from .vocab import grammar_tokenizer

# how JSON is laid out unless a schema's "x-guidance" says otherwise (see the module docstring)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that cannot be used: malformed, refused by llguidance, or over a limit."""

    def __init__(self, message: str, code: str = "invalid_grammar"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must be: ``kind`` is json_object, json_schema, lark or regex; ``source`` the
    schema (a dict) or the grammar text."""

    kind: Literal["json_object", "json_schema", "lark", "regex"]
    source: Any = None

    def describe(self) -> str:
        return {"json_object": "a JSON object", "json_schema": "the JSON schema", "lark": "the Lark grammar",
                "regex": "the regular expression"}[self.kind]


def json_object() -> GrammarSpec:
    """Any JSON object."""
    return GrammarSpec("json_object", {"type": "object"})


def json_schema(schema: dict[str, Any]) -> GrammarSpec:
    """JSON that satisfies ``schema``."""
    return GrammarSpec("json_schema", schema)


def lark(text: str) -> GrammarSpec:
    """Text of the Lark grammar ``text`` (llguidance's dialect)."""
    return GrammarSpec("lark", text)


def regex(text: str) -> GrammarSpec:
    """Text matching the regular expression ``text``."""
    return GrammarSpec("regex", text)


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on a grammar from a request. ``max_source_bytes``: the schema (as compact JSON) or the
    grammar text; ``step_fuel`` and ``step_items``: llguidance's work per token mask (its lexer fuel
    and Earley items: a few milliseconds at most); ``max_lexer_states``: its lexer's size."""

    max_source_bytes: int = 32 * 1024
    step_fuel: int = 200_000
    step_items: int = 50_000
    max_lexer_states: int = 100_000
    initial_fuel: int = 1_000_000

    def parser_limits(self) -> Any:
        import llguidance
        return llguidance.LLParserLimits(step_lexer_fuel=self.step_fuel, step_max_items=self.step_items,
                                         max_lexer_states=self.max_lexer_states,
                                         initial_lexer_fuel=self.initial_fuel, verbose_errors=False)


def schema_text(schema: Any, what: str = "the schema") -> str:
    """``schema`` as compact JSON, checking that it is a JSON object (GrammarError otherwise)."""
    if not isinstance(schema, dict):
        raise GrammarError(f"{what} must be a JSON object, got {type(schema).__name__}", "invalid_schema")
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError) as e:
        raise GrammarError(f"{what} cannot be serialised as JSON: {e}", "invalid_schema") from None


def llguidance_grammar(spec: GrammarSpec) -> str:
    """The llguidance grammar (its JSON form) of ``spec``; GrammarError for a malformed source."""
    import llguidance
    if spec.kind in ("json_object", "json_schema"):
        text = schema_text(spec.source)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}", "invalid_schema") from None
    if not isinstance(spec.source, str) or not spec.source.strip():
        raise GrammarError(f"{spec.describe()} must be a non-empty string")
    if spec.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    return llguidance.LLMatcher.grammar_from_regex(spec.source)


@dataclass
class CompiledGrammar:
    """A grammar checked against the vocabulary; ``new_constraint()`` is one sequence's state."""

    spec: GrammarSpec
    tokenizer: Any = field(repr=False)  # the llguidance tokenizer
    n_vocab: int
    stop_ids: frozenset[int]
    _template: Any = field(repr=False)  # a fresh matcher, copied for every sequence

    def new_constraint(self):
        """A ``Constraint`` at the start of the grammar."""
        from .constraint import Constraint
        return Constraint(self._template.deep_copy(), self.n_vocab, self.stop_ids)


class GrammarCompiler:
    """Compiles grammar specs for one model: its tokenizer, its logits' size, ``limits``. The llguidance
    tokenizer is built on first use (about a second), once; ``compile`` may run on any thread."""

    def __init__(self, tokenizer: Any, n_vocab: int, limits: GrammarLimits | None = None):
        self.tokenizer, self.n_vocab = tokenizer, int(n_vocab)
        self.limits = limits or GrammarLimits()
        self._llg_tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def grammar_tokenizer(self) -> Any:
        """llguidance's tokenizer for the model (built once)."""
        with self._lock:
            if self._llg_tokenizer is None:
                self._llg_tokenizer = grammar_tokenizer(self.tokenizer, self.n_vocab)
            return self._llg_tokenizer

    def check_size(self, spec: GrammarSpec) -> None:
        """GrammarError (code ``grammar_too_large``) when the spec's source exceeds the size limit."""
        text = spec.source if isinstance(spec.source, str) else schema_text(spec.source)
        size = len(text.encode("utf-8"))
        if size > self.limits.max_source_bytes:
            raise GrammarError(f"{spec.describe()} is {size} bytes; this server accepts at most "
                               f"{self.limits.max_source_bytes}", "grammar_too_large")

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """``spec`` checked and compiled; GrammarError naming what is wrong."""
        import llguidance
        self.check_size(spec)
        grammar = llguidance_grammar(spec)
        tok = self.grammar_tokenizer
        limits = self.limits.parser_limits()
        error = llguidance.LLMatcher.validate_grammar(grammar, tok, limits=limits)
        if error:
            raise GrammarError(f"{spec.describe()} was refused by the grammar engine: {_first_line(error)}")
        matcher = llguidance.LLMatcher(tok, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise GrammarError(f"{spec.describe()} was refused by the grammar engine: "
                               f"{_first_line(matcher.get_error())}")
        compiled = CompiledGrammar(spec, tok, self.n_vocab, frozenset(self.tokenizer.stop_ids), matcher)
        # a vocabulary that cannot write the grammar's first bytes is the request's problem, told now
        # rather than as a failed generation
        try:
            ok = bool(compiled.new_constraint().allowed().any())
        except GrammarError:  # the engine stopped at once: nothing in the vocabulary fits
            ok = False
        if not ok:
            raise GrammarError(f"the model's vocabulary cannot write any text of {spec.describe()}",
                               "grammar_unwritable")
        return compiled


def _first_line(message: str, limit: int = 400) -> str:
    """llguidance's message on one line, shortened to ``limit`` characters."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip()) or "unknown error"
    return text if len(text) <= limit else text[:limit] + "..."
