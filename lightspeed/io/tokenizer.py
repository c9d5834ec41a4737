"""The tokenizer models use: encode, decode, streaming decode, chat templates.

    tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")    # or from_folder(...) / from_file(...)
    ids = tok.encode("Hello world")                                  # list[int]
    tok.decode(ids)                                                  # "Hello world"
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = tok.encode_chat(messages, add_generation_prompt=True)      # its ids; message text stays text
    stream = tok.stream()                                            # incremental detokenizer
    for i in generated_ids:
        print(stream.push(i), end="")                                # text complete so far, never a broken character
    print(stream.flush())
    tok.stop_ids                                                     # ids that end generation (eos, end of turn)

It wraps a ``tokenizers.Tokenizer`` (``.backend``): from tokenizer.json as is, or built
from a GGUF vocabulary by ``gguf_vocab.backend_from_gguf``.
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:  # the tokenizers library is imported when a tokenizer is built (~4 MB resident)
    from tokenizers import Tokenizer as Backend

from . import chat_encode
from .chat_template import render_chat
from .errors import ModelFormatError
from .files import require_regular
from .gguf import GGUFFile, load_gguf

REPLACEMENT = "\ufffd"


class StreamDecoder:
    """Turns token ids into text one id at a time, holding back bytes of an unfinished UTF-8 character.

    Each ``push`` decodes a short window of recent ids and returns only the new text, so
    decoders that depend on context (a SentencePiece leading space, byte tokens) stay right.
    """

    # a UTF-8 character has at most 4 bytes, so a trailing U+FFFD that persists over more ids
    # than this is in the text itself, not an unfinished character
    MAX_PENDING = 4

    def __init__(self, tokenizer: "Tokenizer", skip_special_tokens: bool = False):
        self._tok, self._skip = tokenizer, skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0    # ids before this are already emitted

    def push(self, token_id: int) -> str:
        """Add one id; return the text that became complete ("" while a character is unfinished)."""
        self._ids.append(int(token_id))
        return self._emit(force=False)

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character becomes U+FFFD)."""
        return self._emit(force=True)

    def _emit(self, force: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._tok.decode(self._ids[self._prefix:self._read], self._skip)
        after = self._tok.decode(self._ids[self._prefix:], self._skip)
        pending = len(self._ids) - self._read
        if not force and after.endswith(REPLACEMENT) and pending <= self.MAX_PENDING:
            return ""
        if not after.startswith(before):  # the context changed earlier text (rare); emit from the split point
            common = os.path.commonprefix([before, after])
            new = after[len(common):]
        else:
            new = after[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        return new


class Tokenizer:
    """Text <-> token ids for one model, with its special tokens and chat template."""

    def __init__(self, backend: Backend, *, bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, chat_template: str | None = None,
                 extra_stop_ids: Iterable[int] = (), source: str = ""):
        self.backend = backend
        self.source = source
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self.chat_template = chat_template
        self._extra_stop = {int(i) for i in extra_stop_ids}
        # encode_plain reads special-token strings as text by flipping the backend's encode_special_tokens for
        # one call (a second backend would hold another copy of the vocabulary: +15 MB for SmolLM2, +99 MB for
        # Gemma 3), so every encode of this tokenizer holds the lock (serve encodes from a thread pool)
        self._encode_lock = threading.Lock()
        self._specials: tuple[dict[int, str], Any] | None = None  # special_tokens and their regex (lazy)

    # construction ------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf: "GGUFFile | str | os.PathLike[str]") -> "Tokenizer":
        """The tokenizer stored in a GGUF file (``tokenizer.ggml.*`` and ``tokenizer.chat_template``)."""
        gf = gguf if isinstance(gguf, GGUFFile) else load_gguf(gguf)
        info = gf.tokenizer_info()
        name = lambda i: info.tokens[i] if i is not None else None  # noqa: E731
        stops = [i for i, t in enumerate(info.tokens) if t in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>",
                                                                "<|end|>", "<|endoftext|>")
                 and info.token_types and info.token_types[i] == 3]
        from .gguf_vocab import backend_from_gguf
        return cls(backend_from_gguf(info, gf.path), bos_token=name(info.bos_id), eos_token=name(info.eos_id),
                   pad_token=name(info.pad_id), chat_template=info.chat_template, extra_stop_ids=stops,
                   source=gf.path)

    @classmethod
    def from_file(cls, tokenizer_json: "str | os.PathLike[str]", tokenizer_config: dict[str, Any] | None = None,
                  chat_template: str | None = None,
                  generation_config: dict[str, Any] | None = None) -> "Tokenizer":
        """A tokenizer.json, with the special tokens of tokenizer_config.json and the end-of-sequence ids
        of generation_config.json (both optional dicts)."""
        path = require_regular(tokenizer_json)  # the tokenizers library would block on a FIFO
        try:
            from tokenizers import Tokenizer as Backend
            backend = Backend.from_file(path)
        except Exception as e:  # tokenizers raises a plain Exception for malformed files
            raise ModelFormatError(path, f"cannot load tokenizer: {e}") from None
        cfg = tokenizer_config or {}

        def special(key: str) -> str | None:
            v = cfg.get(key)
            return v.get("content") if isinstance(v, dict) else v if isinstance(v, str) else None

        eos = (generation_config or {}).get("eos_token_id", [])
        eos = [eos] if isinstance(eos, int) else [i for i in eos if isinstance(i, int)] if isinstance(eos, list) else []
        return cls(backend, bos_token=special("bos_token"), eos_token=special("eos_token"),
                   pad_token=special("pad_token"), chat_template=chat_template or cfg.get("chat_template"),
                   extra_stop_ids=eos, source=path)

    @classmethod
    def from_folder(cls, folder) -> "Tokenizer":
        """The tokenizer of a Hugging Face model folder (a path or a ``ModelFolder``)."""
        from .model_folder import ModelFolder, load_model_folder
        mf = folder if isinstance(folder, ModelFolder) else load_model_folder(folder)
        if mf.tokenizer_json is None:
            raise ModelFormatError(mf.path, "no tokenizer.json in the model folder")
        return cls.from_file(mf.tokenizer_json, mf.tokenizer_config, mf.chat_template, mf.generation_config)

    # vocabulary --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    @property
    def bos_id(self) -> int | None:
        return self.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def eos_id(self) -> int | None:
        return self.token_to_id(self.eos_token) if self.eos_token else None

    @property
    def pad_id(self) -> int | None:
        return self.token_to_id(self.pad_token) if self.pad_token else None

    @property
    def stop_ids(self) -> set[int]:
        """Ids that end generation: the eos token and the model's end-of-turn tokens."""
        out = set(self._extra_stop)
        if self.eos_id is not None:
            out.add(self.eos_id)
        return out

    # text --------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Special-token strings in the text (``<|im_start|>``) become their ids;
        ``add_special_tokens`` adds what the model puts around every input (e.g. BOS)."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        with self._encode_lock:
            return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    @property
    def special_tokens(self) -> dict[int, str]:
        """The special (control) tokens that ``encode`` parses in text: id -> string."""
        return {i: t.content for i, t in self.backend.get_added_tokens_decoder().items() if t.special}

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` read as plain text: a special-token string becomes ordinary pieces."""
        backend = self.backend
        with self._encode_lock:
            before = backend.encode_special_tokens
            backend.encode_special_tokens = True
            try:
                return backend.encode(text, add_special_tokens=False).ids
            finally:
                backend.encode_special_tokens = before

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (bytes of an unfinished character become U+FFFD)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
        """An incremental decoder for generated ids."""
        return StreamDecoder(self, skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False,
                            chat_template: str | None = None, **extra: Any) -> str:
        """Render the chat template (the model's, or ``chat_template``) for ``messages``."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError(f"{self.source or 'this tokenizer'} has no chat template; pass chat_template=")
        return render_chat(template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_token, eos_token=self.eos_token, **extra)

    def encode_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False,
                    chat_template: str | None = None, **extra: Any) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template, where the template's own markers are
        special tokens and text inside the messages never is (``<|im_end|>`` in a user message stays text).
        For messages without special-token strings: ``encode(apply_chat_template(...), False)`` exactly."""
        if self._specials is None:  # the vocabulary does not change: the pattern is built once
            specials = self.special_tokens
            self._specials = specials, chat_encode.special_pattern(list(specials.values()))
        specials, pattern = self._specials
        nonce = chat_encode.new_nonce()
        masked, table = chat_encode.mask_messages(messages, pattern, nonce)
        text = self.apply_chat_template(masked, add_generation_prompt=add_generation_prompt,
                                        chat_template=chat_template, **extra)
        text, spans = chat_encode.restore(text, table, nonce)
        with self._encode_lock:
            enc = self.backend.encode(text, add_special_tokens=False)
        return chat_encode.splice_plain(enc.ids, enc.offsets, text, spans, set(specials), self.encode_plain)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r})"
