"""Algebraic identities of single ops: multiplying by one, adding zero, double negation and reciprocal,
constant chains, comparisons of a value with itself, chains of casts."""
from __future__ import annotations

from ..pattern import P
from ..rule import EXACT, ROUNDING, VALUE, Rule
from ._build import float_node, full, keeps_dtype, lossless


def _mul_zero(m):
    # x * 0 is 0 for integers; with a bool operand the Mul is a select, whose untaken branch never leaks
    # (for floats, inf * 0 and NaN * 0 are NaN, so the rule does not apply)
    x = m.x
    zero_is_bool = m.values["zero"] is False or m.bindings["zero"].dtype.name == "bool"
    if not float_node(m) or zero_is_bool or x.dtype.name == "bool":
        return full(m, 0)
    return None


def _cast_chain(m):
    x, mid, to = m.x, m.mid.dtype, m.node.dtype
    if not lossless(x.dtype, mid):
        return None
    # float->int saturates and int->int wraps: the second cast must see the same kind of number
    if to.is_int and x.dtype.is_float != mid.is_float:
        return None
    return x.cast(to)


def _const_chain(op):
    def build(m):
        if not keeps_dtype(m, "x"):
            return None  # (x * a) * b with a bool x is a select: 0 * b is not 0 for b = inf
        inner = m.a * m.b if op == "mul" else m.a + m.b  # two constants: folded on the next pass
        return m.x * inner if op == "mul" else m.x + inner
    return build


def _only(pred, build):
    def f(m):
        return build(m) if pred(m) else None
    return f


def _int_node(m):
    return not m.node.dtype.is_float


def _is_bool(m) -> bool:
    return m.x.dtype.name == "bool"


RULES = [
    Rule("mul-one", P.x * 1, _only(lambda m: keeps_dtype(m, "x"), lambda m: m.x), EXACT),
    Rule("add-zero", P.x + 0, _only(lambda m: keeps_dtype(m, "x"), lambda m: m.x), VALUE,
         "x + 0 is x, except that -0.0 + 0.0 is +0.0"),
    Rule("mul-zero", P.x * P.const(0, name="zero"), _mul_zero, EXACT,
         "integers and bool selects only: for floats inf * 0 is NaN"),
    Rule("neg-neg", (P.x * -1) * -1, _only(lambda m: keeps_dtype(m, "x"), lambda m: m.x), EXACT,
         "negation is exact in floats and wraps consistently in integers"),
    Rule("not-not", P.x.less_than(True).less_than(True), _only(_is_bool, lambda m: m.x), EXACT,
         "bools: not(not b) is b (logical_not is b < True)"),
    Rule("lt-self", P.x.less_than(P.x), lambda m: full(m, False), EXACT, "x < x is false, also for NaN"),
    Rule("cast-chain", P.x.cast(name="mid").cast(), _cast_chain, EXACT,
         "only when the first cast is lossless for x and, for an integer result, keeps x's kind"),
    Rule("recip-recip", P.x.recip().recip(), lambda m: m.x, ROUNDING,
         "1/(1/x) rounds twice (an ulp from x); 0 for subnormal x, whose reciprocal overflows"),
    Rule("mul-consts-int", (P.x * P.const(name="a")) * P.const(name="b"), _only(_int_node, _const_chain("mul")),
         EXACT, "integers wrap, so multiplication is associative"),
    Rule("add-consts-int", (P.x + P.const(name="a")) + P.const(name="b"), _only(_int_node, _const_chain("add")),
         EXACT, "integers wrap, so addition is associative"),
    Rule("mul-consts-float", (P.x * P.const(name="a")) * P.const(name="b"), _only(float_node, _const_chain("mul")),
         ROUNDING, "(x*a)*b vs x*(a*b): one rounding less; may overflow differently"),
    Rule("add-consts-float", (P.x + P.const(name="a")) + P.const(name="b"), _only(float_node, _const_chain("add")),
         ROUNDING, "(x+a)+b vs x+(a+b): one rounding less"),
]
