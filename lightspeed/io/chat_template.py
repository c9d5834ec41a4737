"""Rendering chat templates (Jinja2) the way Hugging Face transformers does, within bounds.

Templates run in a sandbox (no attribute access to Python internals) with
``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, and the helpers
templates expect: ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson``
filter that keeps non-ASCII text. Variables: ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, plus any extra keyword (``tools``, ``documents``, ...).

A template comes from a model file, so every render is bounded (``TemplateLimits``: wall
clock, loop iterations, ``range`` size, output and string sizes, call depth; see
``template_sandbox`` for how) and ``include``/``import``/``extends`` are refused. Crossing a
bound raises ``ChatTemplateLimitError``; any other failure ``ChatTemplateError``.
"""
from __future__ import annotations

import datetime
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

from .errors import ChatTemplateError, ChatTemplateLimitError
from .template_limits import RenderBudget, TemplateLimits

if TYPE_CHECKING:
    import jinja2

# jinja2 is imported when a template is first compiled: a process that never renders a chat prompt
# (bench, embeddings) does not hold it (~6 MB resident)


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Parse a chat template once (cached by its text); render it with ``render_chat``."""
    import jinja2

    from .template_sandbox import GuardedEnvironment, guarded_template
    env = GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.add_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return guarded_template(env, source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error on line {e.lineno}: {e.message}") from None
    except RecursionError:
        raise ChatTemplateError("chat template is nested too deeply to parse") from None


def render_chat(source: str, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False,
                bos_token: str | None = None, eos_token: str | None = None, *,
                limits: TemplateLimits | None = None, **extra: Any) -> str:
    """The prompt text for ``messages`` (a list of ``{"role": ..., "content": ...}``), rendered within
    ``limits`` (default ``TemplateLimits()``)."""
    if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts such as {'role': 'user', 'content': 'Hi'}")
    template = compile_template(source)
    from .template_sandbox import BUDGET_KEY
    variables = dict(extra, messages=list(messages), add_generation_prompt=add_generation_prompt,
                     bos_token=bos_token or "", eos_token=eos_token or "")
    variables[BUDGET_KEY] = RenderBudget(limits or TemplateLimits())
    import jinja2
    try:
        # the budget is charged from inside the render (see template_sandbox), so generate() stops there
        return "".join(template.generate(variables))
    except ChatTemplateError:
        raise
    except RecursionError:
        raise ChatTemplateLimitError("chat template stopped: recursion too deep") from None
    except MemoryError:
        raise ChatTemplateLimitError("chat template stopped: out of memory") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - the template's own bugs (1/0, "a" - 1) are the template's errors
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
