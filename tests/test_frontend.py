"""Every frontend op against numpy/torch on the reference backend, with static and symbolic shapes.

The cases live in tests/frontend_cases.py so that other backends can run the same list.
"""
from __future__ import annotations

import pytest

from frontend_cases import CASES, Case, run_case

BACKEND = "reference"


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op(case: Case, symbolic: bool) -> None:
    if case.torch:
        pytest.importorskip("torch")
    if symbolic and not case.symbolic:
        pytest.skip("this case has no symbolic dims")
    run_case(case, BACKEND, symbolic)


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
