"""Every frontend op compiled by the C backend, compared with the same oracles as the reference backend."""
from __future__ import annotations

import pytest

from frontend_cases import CASES, Case, run_case

BACKEND = "c"


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_c(case: Case, symbolic: bool) -> None:
    if case.torch:
        pytest.importorskip("torch")
    if symbolic and not case.symbolic:
        pytest.skip("this case has no symbolic dims")
    run_case(case, BACKEND, symbolic)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_c_generated_only(case: Case) -> None:
    """The compiler's own kernels alone (no lowered templates: matmuls as gemm kernels, attention as
    primitives), one symbolic graph per case where it has symbolic dims."""
    if case.torch:
        pytest.importorskip("torch")
    run_case(case, BACKEND, case.symbolic, templates=False)
