"""How a Llama-family model splits into pipeline stages, and the weights one stage may read.

Stage ``s`` of ``S`` holds a contiguous range of layers, as even as the count allows (earlier stages take
the remainder: 30 layers over 4 stages are 8, 8, 7, 7). Stage 0 also holds the token embedding, the last
stage the output norm and the LM head (and the embedding again when the head is tied to it). A model with
fewer layers than stages is refused by name. ``StageWeights`` lets a stage read only its own tensors: a
name of another stage's layer raises ``PipelineError``, so no other layer's weights are mapped into a
program (nor paged in), and it records the bytes of each tensor it handed out.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..graph import Graph
from ..tensor import Tensor

__all__ = ["PipelineError", "StagePlan", "StageWeights", "stage_ranges"]


class PipelineError(ValueError):
    """A model cannot be split into the stages asked for, or a stage reached for another stage's weights."""


def stage_ranges(n_layers: int, stages: int) -> list[range]:
    """The layers of each of ``stages`` stages: contiguous, as even as possible, earlier stages larger."""
    if stages < 1:
        raise PipelineError(f"pipeline parallelism needs at least 1 stage, got {stages}")
    if n_layers < stages:
        raise PipelineError(f"the model has {n_layers} layers (block_count), fewer than the {stages} pipeline "
                            "stages asked for: each stage needs at least one layer")
    base, extra = divmod(n_layers, stages)
    out, start = [], 0
    for s in range(stages):
        size = base + (s < extra)
        out.append(range(start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class StagePlan:
    """Stage ``stage`` of ``stages``: its ``layers``; ``first`` holds the embedding, ``last`` the head."""

    stages: int
    stage: int
    layers: range

    @classmethod
    def for_config(cls, config, stages: int, stage: int) -> "StagePlan":
        """The plan of ``stage`` for a model config (its ``n_layers``)."""
        if not 0 <= stage < stages:
            raise PipelineError(f"stage {stage} of {stages} stages")
        return cls(stages, stage, stage_ranges(config.n_layers, stages)[stage])

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def __str__(self) -> str:
        return f"stage {self.stage} of {self.stages} (layers {self.layers.start}..{self.layers.stop - 1})"


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None


class StageWeights:
    """The weights one stage reads (see the module docstring): the full store's names, refused outside the
    stage. ``held`` maps each tensor handed out to its bytes in the file; ``layer_bytes()`` sums the layers'."""

    def __init__(self, full, plan: StagePlan, tied: bool):
        self.full, self.plan = full, plan
        self.path = getattr(full, "path", None)
        if hasattr(full, "file"):
            self.file = full.file
        self.held: dict[str, int] = {}
        own = {"token_embd.weight"} if plan.first else set()
        if plan.last:
            own |= {"output_norm.weight", "output.weight"} | ({"token_embd.weight"} if tied else set())
        self._own = own

    def __contains__(self, name: str) -> bool:  # metadata only: whether the file has it
        return name in self.full

    def shape(self, name: str) -> tuple[int, ...]:
        return self.full.shape(name)

    def _check(self, name: str) -> None:
        layer = _layer_of(name)
        if layer is None:
            if name not in self._own and name != "rope_freqs.weight":
                raise PipelineError(f"{name} is not held by {self.plan}")
        elif layer not in self.plan.layers:
            raise PipelineError(f"{name} belongs to layer {layer}, not to {self.plan}")
        if name not in self.held:
            self.held[name] = self._bytes(name)

    def _bytes(self, name: str) -> int:
        file = getattr(self.full, "file", None)
        if file is not None and name in file.tensors:
            return int(file.tensors[name].n_bytes)
        return int(self.full.numpy(name).nbytes)

    def tensor(self, g: Graph, name: str) -> Tensor:
        self._check(name)
        return self.full.tensor(g, name)

    def rows(self, g: Graph, name: str, ids: Tensor) -> Tensor:
        self._check(name)
        return self.full.rows(g, name, ids)

    def numpy(self, name: str):
        self._check(name)
        return self.full.numpy(name)

    def layer_bytes(self) -> int:
        """Bytes of the layer tensors (``blk.<i>.*``) this stage has read."""
        return sum(b for n, b in self.held.items() if _layer_of(n) is not None)

    def layers_held(self) -> set[int]:
        """The layers whose tensors this stage has read."""
        return {_layer_of(n) for n in self.held if _layer_of(n) is not None}
