"""A Jinja2 sandbox whose every unbounded construct reports to a ``RenderBudget``.

Jinja compiles a template to Python, so a render can only be stopped from code it calls.
The parsed template is rewritten before it is compiled so that such code runs often enough:

- every ``for`` iterates through a guard (one budget charge per iteration);
- ``~`` concatenation becomes a guarded join (its length is checked before it is built);
- literal text becomes an expression, so it passes through ``finalize`` like ``{{ ... }}`` output:
  every output piece (in macros and ``{% set %}`` blocks too) is counted and checked;
- ``include``, ``import``, ``from`` and ``extends`` are refused at compile time.

The environment intercepts ``+ * ** %`` (sizes checked before the result is built), wraps every
filter (argument and result sizes), tracks the depth of calls (macros, recursive loops) and
replaces ``range``. All hooks take the render context (``pass_context``), which also keeps
Jinja's optimiser from running them at compile time, outside any budget. The budget travels
in the render variables under a key that is not a valid template name, so a template can
neither read nor replace it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from .errors import ChatTemplateError
from .template_limits import RenderBudget, estimate_size, format_estimate

BUDGET_KEY = "lightspeed budget"   # a space: no template can name it
_GUARD_FILTER = "lightspeed guard"
_CONCAT_FILTER = "lightspeed concat"
_REFUSED = {nodes.Include: "include", nodes.Import: "import", nodes.FromImport: "from ... import",
            nodes.Extends: "extends"}
MAX_JSON_INDENT = 64  # tojson(indent=n) repeats n spaces per line: a huge n makes a huge text from a small value
# filters whose result size depends on more than their arguments' sizes
_AMPLIFYING = {"join", "tojson", "string", "pprint", "sum", "list"}


def _budget(context: Any) -> RenderBudget:
    b = context.get(BUDGET_KEY)
    if not isinstance(b, RenderBudget):  # rendered without one: refuse rather than run unbounded
        raise ChatTemplateError("chat templates must be rendered through lightspeed.io.render_chat")
    return b


def _check_int_args(budget: RenderBudget, args: tuple, kwargs: dict, what: str) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > budget.limits.max_chars:
            budget.size(abs(a), what)


_TEXT = (str, bytes, bytearray)
_SEQUENCES = (str, bytes, bytearray, list, tuple)


def _str_method_precheck(budget: RenderBudget, owner: "str | bytes", name: str, args: tuple,
                         kwargs: dict | None = None) -> None:
    """Bounds for the ``str``/``bytes`` methods whose result can be much longer than their arguments."""
    if name == "join" and args:
        budget.size(estimate_size(args[0], budget.limits.max_chars) + len(owner) * _length(args[0]),
                    f"{type(owner).__name__}.join")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], _TEXT) and isinstance(args[1], _TEXT):
        hits = owner.count(args[0]) if args[0] else len(owner) + 1
        budget.size(len(owner) + hits * len(args[1]), f"{type(owner).__name__}.replace")
    elif name == "expandtabs":
        size = args[0] if args else (kwargs or {}).get("tabsize", 8)
        if isinstance(size, int):
            tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
            budget.size(len(owner) + tabs * max(size, 0), f"{type(owner).__name__}.expandtabs")
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, _TEXT)), default=1)
        budget.size(len(owner) * longest, "str.translate")


def _length(x: Any) -> int:
    try:
        return len(x)
    except TypeError:
        return 0


def _result_check(budget: RenderBudget, value: Any, what: str) -> Any:
    if isinstance(value, (*_SEQUENCES, dict)):
        budget.size(len(value), what)
    return value


def _filter_precheck(budget: RenderBudget, name: str, value: Any, args: tuple, kwargs: dict, what: str) -> None:
    """Bounds on a filter's result from its input and arguments, checked before it runs."""
    _check_int_args(budget, args, kwargs, what)
    if name in _AMPLIFYING:
        sep = args[0] if name == "join" and args and isinstance(args[0], str) else ""
        budget.size(estimate_size(value, budget.limits.max_chars) + len(sep) * _length(value), what)
    if name == "tojson":
        indents = [a for a in (*args, kwargs.get("indent")) if isinstance(a, int) and not isinstance(a, bool)]
        if any(i > MAX_JSON_INDENT for i in indents):
            raise budget.fail(f"{what}'s indent is {max(indents)} (at most {MAX_JSON_INDENT})")
    if not isinstance(value, str):
        return
    if name == "replace":
        _str_method_precheck(budget, value, "replace", tuple(str(a) for a in args[:2]))
    elif name == "indent":
        width = args[0] if args else kwargs.get("width", 4)
        pad = width if isinstance(width, int) else len(width) if isinstance(width, str) else 4
        budget.size(len(value) + (value.count("\n") + 1) * max(pad, 0), what)
    elif name == "format":
        budget.size(format_estimate(value, (args, kwargs), budget.limits.max_chars), what)
    elif name == "wordwrap":
        width = args[0] if args else kwargs.get("width", 79)
        wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring")
        lines = len(value) // max(width if isinstance(width, int) else 1, 1) + 1
        budget.size(len(value) + lines * (len(wrap) if isinstance(wrap, str) else 2), what)


def _guarded_filter(name: str, func: Callable) -> Callable:
    """``func`` charged to the budget: its input and arguments checked first, its result after."""
    pass_arg = getattr(getattr(func, "jinja_pass_arg", None), "name", None)

    @jinja2.pass_context
    @functools.wraps(func)
    def guarded(context, value=None, *args, **kwargs):
        budget = _budget(context)
        budget.tick()
        what = f"the {name!r} filter"
        _filter_precheck(budget, name, value, args, kwargs, what)
        first = {"context": (context,), "eval_context": (context.eval_ctx,),
                 "environment": (context.environment,)}.get(pass_arg, ())
        return _result_check(budget, func(*first, value, *args, **kwargs), what)

    return guarded


@jinja2.pass_context
def _guard_iter(context, iterable):
    """The iterable of a ``for``: each step charged as one loop iteration."""
    budget = _budget(context)
    budget.tick()
    for item in iterable:
        budget.iteration()
        yield item


@jinja2.pass_context
def _concat(context, parts):
    """``a ~ b ~ ...``, its length checked before it is built."""
    budget = _budget(context)
    strings = [p if isinstance(p, str) else _str(budget, p) for p in parts]
    budget.size(sum(len(s) for s in strings), "the '~' operator")
    return "".join(strings)


def _str(budget: RenderBudget, value: Any) -> str:
    budget.size(estimate_size(value, budget.limits.max_chars), "converting a value to text")
    return str(value)


@jinja2.pass_context
def _finalize(context, value):
    """Every output piece: its size is checked before ``str`` builds it, then charged to the output."""
    budget = _budget(context)
    text = value if isinstance(value, str) else _str(budget, value)
    budget.output(len(text))
    return text


@jinja2.pass_context
def _range(context, *args):
    budget = _budget(context)
    r = range(*args)
    budget.range_items(len(r))
    return r


_range.__name__ = "range"  # errors name the call as the template wrote it


def _binop_precheck(budget: RenderBudget, op: str, left: Any, right: Any) -> None:
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, _SEQUENCES) and isinstance(n, int):
                budget.size(len(seq) * max(n, 0), "the '*' operator")
        if isinstance(left, int) and isinstance(right, int):
            budget.int_bits(left.bit_length() + right.bit_length(), "the '*' operator")
    elif op == "+":
        if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
            budget.size(len(left) + len(right), "the '+' operator")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            budget.int_bits(left.bit_length() * right, "the '**' operator")
    elif op == "%" and isinstance(left, str):
        budget.size(format_estimate(left, right, budget.limits.max_chars), "the '%' operator")


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with budget hooks (see the module docstring)."""

    intercepted_binops = frozenset(["+", "*", "**", "%"])

    def __init__(self, **options: Any):
        super().__init__(finalize=_finalize, **options)
        self.globals["range"] = _range
        self.filters = {name: _guarded_filter(name, f) for name, f in self.filters.items()}
        self.filters[_GUARD_FILTER] = _guard_iter
        self.filters[_CONCAT_FILTER] = _concat

    def add_filter(self, name: str, func: Callable) -> None:
        """Register a filter of the template's environment, budget-guarded like the built-in ones."""
        self.filters[name] = _guarded_filter(name, func)

    def call_binop(self, context, operator_: str, left: Any, right: Any) -> Any:
        budget = _budget(context)
        budget.tick()
        _binop_precheck(budget, operator_, left, right)
        result = super().call_binop(context, operator_, left, right)
        return _result_check(budget, result, f"the {operator_!r} operator")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format``/``format_map`` as the sandbox wraps them, with the result's size bounded first."""
        inner = super().wrap_str_format(value)
        if inner is None:
            return None
        fmt = value.__self__

        @jinja2.pass_context
        def guarded(context, *args: Any, **kwargs: Any) -> str:
            budget = _budget(context)
            budget.size(format_estimate(fmt, (args, kwargs), budget.limits.max_chars), f"str.{value.__name__}")
            return inner(*args, **kwargs)

        guarded.__name__ = value.__name__
        return guarded

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - as the base class
        budget = _budget(__context)
        name = getattr(__obj, "__name__", "a function")
        _check_int_args(budget, args, kwargs, f"calling {name}")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, _TEXT):
            _str_method_precheck(budget, owner, name, args, kwargs)
        budget.enter_call()
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            budget.leave_call()
        return _result_check(budget, result, f"calling {name}")


class _Rewrite(NodeTransformer):
    """The compile-time rewrite of the module docstring."""

    def generic_visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        for kind, construct in _REFUSED.items():
            if isinstance(node, kind):
                raise ChatTemplateError(f"chat template line {node.lineno}: {{% {construct} %}} is not allowed "
                                        "(chat templates cannot load other templates)")
        return super().generic_visit(node, *args, **kwargs)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _GUARD_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Filter(parts, _CONCAT_FILTER, [], [], None, None, lineno=node.lineno)

    def visit_TemplateData(self, node: nodes.TemplateData) -> nodes.Node:
        return nodes.Const(node.data, lineno=node.lineno)


def guarded_template(env: GuardedEnvironment, source: str) -> jinja2.Template:
    """Parse, rewrite and compile ``source`` in ``env``."""
    tree = env.parse(source)
    tree = _Rewrite().visit(tree)
    tree.set_environment(env)
    return env.template_class.from_code(env, env.compile(tree), env.make_globals(None))


__all__ = ["GuardedEnvironment", "guarded_template", "BUDGET_KEY"]
