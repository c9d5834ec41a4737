"""Rendering chat templates (Jinja2) the way Hugging Face transformers does.

Templates run in a sandbox (no attribute access to Python internals) with
``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, and the helpers
templates expect: ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson``
filter that keeps non-ASCII text. Variables: ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, plus any extra keyword (``tools``, ``documents``, ...).
"""
from __future__ import annotations

import datetime
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import jinja2

# jinja2 is imported when a template is first compiled: a process that never renders a chat prompt
# (bench, embeddings) does not hold it (~6 MB resident)


class ChatTemplateError(ValueError):
    """The template is invalid, or raised an error (``raise_exception``) for these messages."""


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Parse a chat template once (cached by its text)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error on line {e.lineno}: {e.message}") from None


def render_chat(source: str, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False,
                bos_token: str | None = None, eos_token: str | None = None, **extra: Any) -> str:
    """The prompt text for ``messages`` (a list of ``{"role": ..., "content": ...}``)."""
    if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts such as {'role': 'user', 'content': 'Hi'}")
    template = compile_template(source)
    import jinja2
    try:
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token or "", eos_token=eos_token or "", **extra)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None
