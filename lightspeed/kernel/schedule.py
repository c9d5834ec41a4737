"""Schedules: how a kernel's loop nest runs, as data, apart from what it computes.

The loop IR (``ir.py``) says *what* a kernel computes at one output index; a ``Schedule`` says *how* the
loops over those indices run: an ordered tuple of small transformation steps, each naming the axis it
applies to. Nothing here is target syntax: every renderer (the C renderer now) reads the same steps and
maps them to its target (threads and SIMD lanes on a CPU, blocks and threads on a GPU).

Axes are named by their role in the kernel's form. A matmul-like kernel (``matmul_form.py``) has
``"m"`` (rows of the left operand), ``"n"`` (columns of the right operand, the contiguous output axis)
and ``"k"`` (the reduced axis); other kernels name output axes ``"o0"``, ``"o1"``, ... and their
top-level reduction ``"r"``; a "tiled" reduction blocks its rows ``"m"`` and columns ``"n"``, a streaming
attention its query rows ``"q"``, its keys ``"keys"`` and its head dimension ``"d"``.

Example, a float32 matmul on a CPU with 512-bit vectors::

    Schedule((Parallel("m"), Parallel("n"),
              Tile("m", 96), Tile("n", 256), Tile("k", 256),
              Register("m", 12), Register("n", 32), Vectorize("n", 16),
              Pack("a", "k"), Pack("b", "k"), Unroll("k", 2)))
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Iterator, Union


@dataclass(frozen=True)
class Parallel:
    """Run the iterations (or tiles) of ``axis`` as independent work items (threads / blocks)."""
    axis: str


@dataclass(frozen=True)
class Tile:
    """Block ``axis`` into tiles of ``size`` iterations (cache blocking: L1/L2 panels, shared memory)."""
    axis: str
    size: int


@dataclass(frozen=True)
class Register:
    """Compute ``size`` iterations of ``axis`` per innermost step, each in its own accumulator."""
    axis: str
    size: int


@dataclass(frozen=True)
class Vectorize:
    """Map ``width`` consecutive iterations of ``axis`` to SIMD lanes (CPU) or threads of a warp (GPU)."""
    axis: str
    width: int


@dataclass(frozen=True)
class Unroll:
    """Unroll the loop over ``axis`` by ``factor``."""
    axis: str
    factor: int


@dataclass(frozen=True)
class SplitReduce:
    """Split the reduction over ``axis`` into ``parts`` partial sums, merged in a fixed order."""
    axis: str
    parts: int


@dataclass(frozen=True)
class Pack:
    """Copy the tile of ``operand`` ("a" or "b") a work item reuses into a contiguous panel, ``along`` the
    axis the micro-kernel walks (so any view, transposed, strided or quantized, reads as a dense stream).

    Without a Pack of "a" no work item packs its own panels of it: a renderer reads a plain load of "a"
    where it lies, and packs any other factor once per call into panels all work items share."""
    operand: str
    along: str


@dataclass(frozen=True)
class IntegerDot:
    """Sum each block of the reduction over ``axis`` whose one operand is an int8 quant (a Q8_0 block, an int8
    matrix) as integers: the other operand quantized per block to ``bits``-bit integers with one scale, the
    products summed exactly by the target's integer dot-product instructions (a renderer's builtin layer), one
    float multiply by the two scales per block. Changes the numerics (within the activations' rounding)."""
    axis: str
    bits: int


@dataclass(frozen=True)
class Grain:
    """Run the kernel's work items on the calling thread when its estimated operations are below ``ops`` (a
    parallel loop costs more than it saves on small work)."""
    ops: int


@dataclass(frozen=True)
class Order:
    """Loop order of the tile loops, outermost first."""
    axes: tuple[str, ...]


Step = Union[Parallel, Tile, Register, Vectorize, Unroll, SplitReduce, Pack, IntegerDot, Grain, Order]
STEP_TYPES: dict[str, type] = {t.__name__: t for t in (Parallel, Tile, Register, Vectorize, Unroll, SplitReduce,
                                                        Pack, IntegerDot, Grain, Order)}
SIZED = {Tile: "size", Register: "size", Vectorize: "width", Unroll: "factor", SplitReduce: "parts",
         IntegerDot: "bits", Grain: "ops"}


class ScheduleError(ValueError):
    """A schedule that cannot apply to its kernel (unknown axis, a size that is not positive, ...)."""


@dataclass(frozen=True)
class Schedule:
    """An ordered tuple of steps. Queries return the step of one kind for one axis (the last one wins, so
    appending a step edits a schedule)."""

    steps: tuple[Step, ...] = ()

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def find(self, kind: type, axis: str | None = None) -> Step | None:
        """The last step of ``kind`` (for ``axis`` when given; Pack matches on its operand)."""
        for s in reversed(self.steps):
            if isinstance(s, kind) and (axis is None or getattr(s, "axis", getattr(s, "operand", None)) == axis):
                return s
        return None

    def size(self, kind: type, axis: str, default: int) -> int:
        """The size a sized step of ``kind`` gives ``axis`` (its tile, register block, width, factor...)."""
        s = self.find(kind, axis)
        return default if s is None else getattr(s, SIZED[kind])

    def parallel(self) -> tuple[str, ...]:
        return tuple(s.axis for s in self.steps if isinstance(s, Parallel))

    def packs(self, operand: str) -> bool:
        return self.find(Pack, operand) is not None

    def with_steps(self, *steps: Step) -> "Schedule":
        """This schedule with ``steps`` applied after its own (they override steps of the same kind and axis)."""
        return Schedule(self.steps + tuple(steps))

    def canonical(self) -> "Schedule":
        """The same schedule with overridden steps dropped, in a stable order (equal meaning, equal text)."""
        seen: dict[tuple, Step] = {}
        for s in self.steps:
            key = (type(s).__name__, getattr(s, "axis", getattr(s, "operand", None)))
            seen[key] = s
        return Schedule(tuple(sorted(seen.values(), key=lambda s: (type(s).__name__, json.dumps(asdict(s))))))

    def validate(self, axes: tuple[str, ...]) -> None:
        """Raise ScheduleError unless every step names one of ``axes`` and every size is positive."""
        for s in self.steps:
            axis = getattr(s, "axis", None)
            if axis is not None and axis not in axes:
                raise ScheduleError(f"schedule step {s} names axis {axis!r}; this kernel has {list(axes)}")
            if isinstance(s, Pack):
                if s.operand not in ("a", "b") or s.along not in axes:
                    raise ScheduleError(f"schedule step {s}: operand must be 'a' or 'b', along one of {list(axes)}")
            if isinstance(s, Order) and sorted(s.axes) != sorted(set(s.axes)):
                raise ScheduleError(f"schedule step {s} repeats an axis")
            attr = SIZED.get(type(s))
            if attr is not None:
                v = getattr(s, attr)
                if not isinstance(v, int) or v < 1:
                    raise ScheduleError(f"schedule step {s}: {attr} must be a positive int, got {v!r}")

    def to_json(self) -> str:
        """A JSON text (for the tuning cache) that ``from_json`` reads back to an equal schedule."""
        return json.dumps([[type(s).__name__, asdict(s)] for s in self.canonical().steps], sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Schedule":
        steps = []
        for name, args in json.loads(text):
            t = STEP_TYPES.get(name)
            if t is None or set(args) != {f.name for f in fields(t)}:
                raise ScheduleError(f"unknown schedule step {name}({args})")
            if t is Order:
                args = {"axes": tuple(args["axes"])}
            steps.append(t(**args))
        return Schedule(tuple(steps))

    def __str__(self) -> str:
        return "Schedule(" + ", ".join(_step_text(s) for s in self.steps) + ")"


def _step_text(s: Step) -> str:
    return f"{type(s).__name__}(" + ", ".join(repr(v) for v in asdict(s).values()) + ")"
