"""Every frontend op against numpy/torch on the reference backend, with static and symbolic shapes.

The cases live in tests/frontend_cases.py so that other backends can run the same list
(``run_case(case, backend, symbolic)``).
"""
from __future__ import annotations

import pytest

from frontend_cases import CASES, Case, run_case

BACKEND = "reference"

PARAMS = [pytest.param(c, False, id=f"{c.name}-static") for c in CASES] + \
         [pytest.param(c, True, id=f"{c.name}-symbolic") for c in CASES if c.symbolic]


@pytest.mark.parametrize("case,symbolic", PARAMS)
def test_op(case: Case, symbolic: bool) -> None:
    if case.torch:
        pytest.importorskip("torch")
    run_case(case, BACKEND, symbolic)


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
