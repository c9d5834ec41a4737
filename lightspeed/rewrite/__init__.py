"""Rewrites of the primitive graph: a pattern matcher and rule sets (data), applied to a fixpoint.

    from lightspeed.rewrite import P, Rule, rewrite_program, rules
    result = rewrite_program(program, rules.SAFE)   # result.program, result.fired
"""
from __future__ import annotations

from . import rules
from .engine import RewriteResult, RuleError, rewrite_program
from .pattern import Match, P, Pattern, match
from .rule import EXACT, ROUNDING, VALUE, Rule

__all__ = ["P", "Pattern", "Match", "match", "Rule", "EXACT", "VALUE", "ROUNDING", "rewrite_program",
           "RewriteResult", "RuleError", "rules"]
