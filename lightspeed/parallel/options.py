"""The ``--tensor-parallel N`` / ``--pipeline-parallel N`` options of the CLI: how many ranks, which flag, and
the checks a launcher makes before it starts them."""
from __future__ import annotations

from ..api import default_model_path
from ..models import load_model
from .stages import stage_ranges

__all__ = ["parallel_ranks", "check_stages"]


def parallel_ranks(tensor_parallel: int, pipeline_parallel: int) -> tuple[int, str]:
    """(ranks to run, the flag that asked for them); ValueError for a count below 1 or both flags above 1."""
    for option, n in (("--tensor-parallel", tensor_parallel), ("--pipeline-parallel", pipeline_parallel)):
        if type(n) is not int or n < 1:
            raise ValueError(f"{option} must be >= 1, got {n}")
    if tensor_parallel > 1 and pipeline_parallel > 1:
        raise ValueError(f"--tensor-parallel {tensor_parallel} with --pipeline-parallel {pipeline_parallel}: "
                         "combining tensor and pipeline parallelism is not supported; use one of them")
    if pipeline_parallel > 1:
        return pipeline_parallel, "--pipeline-parallel"
    return tensor_parallel, "--tensor-parallel"


def check_stages(model_path: str | None, stages: int) -> None:
    """PipelineError when the model (``None``: the default) has fewer layers than ``stages``: refused before N
    ranks start, each to fail alike. The file is only mapped."""
    lm = load_model(default_model_path() if model_path is None else model_path, tokenizer=False)
    stage_ranges(lm.config.n_layers, stages)
