"""Errors the torch backend raises, each naming every offending op and where it came from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One FX node Lightspeed could not lower."""

    node: str        # FX node name, e.g. "sort_1"
    target: str      # the op, e.g. "aten.sort.default"
    reason: str      # why, e.g. "no lowering for this op"
    where: str = ""  # the user's source line PyTorch recorded, when it did

    def describe(self) -> str:
        loc = f"\n      at {self.where}" if self.where else ""
        return f"  - {self.target} (node {self.node}): {self.reason}{loc}"


class UnsupportedOpsError(RuntimeError):
    """The graph holds ops Lightspeed cannot lower; ``problems`` lists every one."""

    def __init__(self, problems: list[Problem], hint: bool = True):
        self.problems = list(problems)
        lines = [f"Lightspeed cannot compile {len(self.problems)} op(s) of this graph:"]
        lines += [p.describe() for p in self.problems]
        if hint:
            lines.append('Pass options={"fallback": "eager"} to torch.compile to run these ops in eager PyTorch '
                         "and compile the rest.")
        super().__init__("\n".join(lines))


class InferenceOnlyError(RuntimeError):
    """Gradients were requested; Lightspeed compiles inference graphs only."""
