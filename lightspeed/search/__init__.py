"""Search-based optimisation: graph-level (rewrites, e-graph, extraction by cost) and kernel-level
(schedules compiled, checked and timed, with an on-disk tuning cache)."""
from __future__ import annotations

from .check import outputs_agree, random_inputs, sample_dims, validate_program
from .calibration import calibrate
from .cost import CostModel, program_cost
from .explain import explain
from .graph_search import GraphSearchResult, search_graph
from .lowering import choose_lowerings, find_alternatives

__all__ = ["search_graph", "GraphSearchResult", "CostModel", "calibrate", "program_cost", "validate_program",
           "outputs_agree", "random_inputs", "sample_dims", "choose_lowerings", "find_alternatives", "explain"]
