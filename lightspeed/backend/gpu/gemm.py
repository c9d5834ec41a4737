"""GPU rendering of matmul-like ("gemm") kernels under their schedule: a tile of outputs per work group,
panels of both operands in local (shared) memory, a register block of outputs per work item.

``out[.., m, .., n] = sum_k a(.., m, k) * b(.., k, n)`` (kernel/matmul_form.py). The kernel's ``Schedule``
(kernel/schedule.py, the same data the C renderer reads) maps to the grid this way:

- ``Parallel("m")``, ``Parallel("n")``: the grid; one work group per ``Tile("m") x Tile("n")`` tile of
  outputs of one batch index, enumerated n-fastest (``Order(("m", "n"))``, consecutive groups share the
  panel of ``a``) or m-fastest (``Order(("n", "m"))``).
- ``Register("m", RM)``, ``Register("n", RN)``: each work item's block of outputs, so a group has
  ``(TM / RM) * (TN / RN)`` work items. Item ``(ty, tx)`` owns rows ``ty + (TM / RM) * i`` and, with
  ``Vectorize("n", VN)``, columns in runs of VN consecutive ones, ``((j / VN) * (TN / RN) + tx) * VN + j % VN``
  (VN = 1 when absent: neighbouring work items own neighbouring columns, so their stores coalesce).
- ``Tile("k", D)``: the depth of the panels. For each D steps of k the group evaluates the ``TM x D`` panel of
  ``a`` and the ``D x TN`` panel of ``b`` into local memory, a barrier, each work item accumulates its RM x RN
  outputs from RM + RN panel values per step, a barrier. ``Unroll("k", U)`` unrolls that step loop.
- ``Pack(operand, along)``: the order in which the work items load an operand's panel: consecutive work items
  take consecutive elements along ``along`` (for ``a``: "k" or "m"; ``b``: "n" or "k"), chosen where the
  operand's loads have unit stride so that a group's loads coalesce (a panel loaded across its rows gets a
  float of padding per row, against bank conflicts of the stores). The factors are IR, so a transposed,
  padded or quantized operand is read through its own index arithmetic, once per work group.

Elements past the ends are zeros in the panels and are not stored. Each output's sum runs over k in order,
as the plain loop does. ``SplitReduce`` is not applied (the few-rows form, reduce.py, splits long sums).
"""
from __future__ import annotations

from ... import symbolic as sym
from ...kernel.heuristics import GpuTarget
from ...kernel.ir import dense_offset
from ...kernel.matmul_form import MatmulForm
from ...kernel.schedule import (IntegerDot, Order, Pack, Register, Schedule, ScheduleError, SplitReduce, Tile, Unroll,
                                Vectorize)

AXES = ("m", "n", "k")
ALONG = {"a": ("k", "m"), "b": ("n", "k")}  # the axes each operand's panel can be loaded along
ORDERS = {("m", "n"): False, ("n", "m"): True, ("m", "n", "k"): False, ("n", "m", "k"): True}  # -> m fastest
MAX_ACCUMULATORS = 256  # per work item (a GPU thread has at most 255 registers)


def gpu_gemm_sizes(s: Schedule, target: GpuTarget | None = None) -> dict:
    """The sizes schedule ``s`` sets for the GPU gemm (TM, TN, D tiles, RM x RN block, VN, U, MFAST, the
    panels' load axes A_ALONG / B_ALONG, THREADS per group), checked against ``target``'s limits when given.
    Raises ScheduleError naming the step that cannot apply."""
    s.validate(AXES)
    for step in s:
        if isinstance(step, SplitReduce) and step.parts > 1:
            raise ScheduleError(f"GPU gemm schedule: {step} is not applied (a work group sums all of k; the "
                                "few-rows form splits long sums across a group)")
        if isinstance(step, Register) and step.axis == "k" or isinstance(step, Vectorize) and step.axis != "n":
            raise ScheduleError(f"GPU gemm schedule: {step} is not applied (blocks are of m and n, runs along n)")
        if isinstance(step, IntegerDot):
            raise ScheduleError(f"GPU gemm schedule: {step} is not applied (the GPU kernels sum in float)")
        if isinstance(step, Unroll) and step.axis != "k":
            raise ScheduleError(f"GPU gemm schedule: {step} is not applied (only the step loop over k unrolls)")
        if isinstance(step, Order) and tuple(step.axes) not in ORDERS:
            raise ScheduleError(f"GPU gemm schedule: {step} is not applied: work groups run ('m', 'n') or "
                                "('n', 'm'), k (if named) last")
        if isinstance(step, Pack) and step.along not in ALONG[step.operand]:
            raise ScheduleError(f"GPU gemm schedule: {step}: operand {step.operand!r} loads along one of "
                                f"{list(ALONG[step.operand])}")
    z = {"TM": s.size(Tile, "m", 64), "TN": s.size(Tile, "n", 64), "D": s.size(Tile, "k", 16),
         "RM": s.size(Register, "m", 4), "RN": s.size(Register, "n", 4), "VN": s.size(Vectorize, "n", 1),
         "U": s.size(Unroll, "k", 1)}
    order = s.find(Order)
    z["MFAST"] = order is not None and ORDERS[tuple(order.axes)]
    for operand in ("a", "b"):
        p = s.find(Pack, operand)
        z[f"{operand.upper()}_ALONG"] = p.along if p is not None else ALONG[operand][0]
    if z["TM"] % z["RM"] or z["TN"] % z["RN"]:
        raise ScheduleError(f"GPU gemm schedule: tiles {z['TM']}x{z['TN']} are not multiples of the register "
                            f"block {z['RM']}x{z['RN']}")
    if z["RN"] % z["VN"]:
        raise ScheduleError(f"GPU gemm schedule: Register('n', {z['RN']}) is not a multiple of Vectorize('n', "
                            f"{z['VN']})")
    if z["RM"] * z["RN"] > MAX_ACCUMULATORS:
        raise ScheduleError(f"GPU gemm schedule: {z['RM']}x{z['RN']} accumulators per work item is too many "
                            f"(at most {MAX_ACCUMULATORS})")
    z["THREADS"] = (z["TM"] // z["RM"]) * (z["TN"] // z["RN"])
    if target is not None:
        if z["THREADS"] > target.max_group:
            raise ScheduleError(f"GPU gemm schedule: {z['THREADS']} work items per group (tile {z['TM']}x"
                                f"{z['TN']} over blocks {z['RM']}x{z['RN']}); the device allows {target.max_group}")
        local = panel_bytes(z)
        if local > target.local_bytes:
            raise ScheduleError(f"GPU gemm schedule: panels of {local} bytes (tiles {z['TM']}x{z['TN']}, depth "
                                f"{z['D']}); the device has {target.local_bytes} bytes of local memory")
    return z


def panel_widths(z: dict) -> tuple[int, int]:
    """Row lengths of the panels ``As[TM][.]`` and ``Bs[D][.]`` under sizes ``z``: a panel loaded across its
    rows (``a`` along m, ``b`` along k) gets one float of padding per row, so that consecutive work items'
    stores, a row apart, fall in different banks of local memory."""
    return z["D"] + (z["A_ALONG"] == "m"), z["TN"] + (z["B_ALONG"] == "k")


def panel_bytes(z: dict) -> int:
    """Local memory of the two panels (float32) under sizes ``z``."""
    wa, wb = panel_widths(z)
    return 4 * (z["TM"] * wa + z["D"] * wb)


def render_gemm(r, form: MatmulForm) -> tuple[str, sym.sint, int]:
    """(kernel text named ``KFN``, work items, work-group size) of gemm kernel ``r.kernel`` under its
    schedule (the default sizes when it has none); ``r`` is the KernelRenderer of that kernel."""
    k, em = r.kernel, r.em
    z = gpu_gemm_sizes(k.schedule or Schedule())
    TM, TN, D, RM, RN, VN, THREADS = (z[x] for x in ("TM", "TN", "D", "RM", "RN", "VN", "THREADS"))
    SM, SN = TM // RM, TN // RN  # work items along m and along n
    shape, vars_ = list(k.shape), list(k.loop_vars)
    mvar, nvar, kvar = vars_[form.m], vars_[form.n], form.reduce.var
    M, N = shape[form.m], shape[form.n]
    tiles_m = sym.floordiv(sym.add(M, TM - 1), TM)
    tiles_n = sym.floordiv(sym.add(N, TN - 1), TN)
    batch = [(vars_[i], shape[i]) for i in form.batch]
    groups = sym.mul(sym.prod([s for _, s in batch]), sym.mul(tiles_m, tiles_n))
    r.declare_buffers()
    em.line(f"const ls_i64 lid = LS_LOCAL_ID, ty = lid / {SN}, tx = lid % {SN};")
    wa, wb = panel_widths(z)
    em.line(f"LS_SHARED float As[{TM}][{wa}];")
    em.line(f"LS_SHARED float Bs[{D}][{wb}];")
    em.line("ls_i64 rest = LS_GROUP_ID;")
    tn, tm = em.sym(tiles_n), em.sym(tiles_m)
    first, second = (("m0", tm, TM), ("n0", tn, TN)) if z["MFAST"] else (("n0", tn, TN), ("m0", tm, TM))
    for name, count, size in (first, second):
        em.line(f"const ls_i64 {name} = (rest % {count}) * {size}; rest = rest / {count};")
    for pos in range(len(batch) - 1, -1, -1):
        v, size = batch[pos]
        name = r.local_name(v)
        if pos == 0:
            em.line(f"const ls_i64 {name} = rest;")
        else:
            s = em.sym(size)
            em.line(f"const ls_i64 {name} = rest % {s}; rest = rest / {s};")
        em.bind(v, name)
    Mt, Nt, K = em.sym(M), em.sym(N), em.sym(form.reduce.size)
    em.line(f"float acc[{RM}][{RN}];")
    em.line(f"for (int i = 0; i < {RM}; i++) for (int j = 0; j < {RN}; j++) acc[i][j] = 0.0f;")
    with em.block(f"for (ls_i64 k0 = 0; k0 < {K}; k0 += {D})"):
        _panel(r, "As", TM, D, z["A_ALONG"] == "k", THREADS, ("m0", mvar, Mt), ("k0", kvar, K), form.a)
        _panel(r, "Bs", D, TN, z["B_ALONG"] == "n", THREADS, ("k0", kvar, K), ("n0", nvar, Nt), form.b)
        em.line("LS_BARRIER;")
        em.line(f"const ls_i64 kn = ls_min({D}, {K} - k0);")
        if z["U"] > 1:
            em.line(f"#pragma unroll {z['U']}")
        with em.block("for (ls_i64 kk = 0; kk < kn; kk++)"):
            em.line(f"float ar[{RM}], br[{RN}];")
            em.line(f"for (int i = 0; i < {RM}; i++) ar[i] = As[ty + {SM} * i][kk];")
            em.line(f"for (int j = 0; j < {RN}; j++) br[j] = Bs[kk][{_column('j', VN, SN)}];")
            em.line(f"for (int i = 0; i < {RM}; i++) for (int j = 0; j < {RN}; j++) acc[i][j] += ar[i] * br[j];")
        em.line("LS_BARRIER;")
    with em.block(f"for (int i = 0; i < {RM}; i++)"):
        with em.block(f"for (int j = 0; j < {RN}; j++)"):
            em.line(f"const ls_i64 om = m0 + ty + {SM} * i, on = n0 + {_column('j', VN, SN)};")
            with em.block(f"if (om < {Mt} && on < {Nt})"):
                em.bind(mvar, "om")
                em.bind(nvar, "on")
                off = em.sym(dense_offset(vars_, shape))
                em.line(f"{r.buf(k.out)}[{off}] = {r.store_value(k.out.dtype, 'acc[i][j]')};")
    return r.finish(), sym.mul(groups, THREADS), THREADS


def _column(j: str, VN: int, SN: int) -> str:
    """The tile column of a work item's register column ``j``: runs of VN consecutive columns, the work items
    of a row of the group side by side within each run of SN * VN."""
    if VN == 1:
        return f"tx + {SN} * {j}"
    return f"(({j} / {VN}) * {SN} + tx) * {VN} + {j} % {VN}"


def _panel(r, name: str, rows: int, cols: int, along_cols: bool, threads: int, row_axis: tuple, col_axis: tuple,
           factor) -> None:
    """Lines that evaluate a ``rows x cols`` panel of ``factor`` into local array ``name``, every work item
    taking elements ``lid, lid + threads, ...``; consecutive work items walk the columns (``along_cols``) or
    the rows. ``row_axis`` / ``col_axis``: (the tile's origin, the loop variable, its extent) of each side;
    elements past an extent are zero."""
    em = r.em
    total = rows * cols
    per_item = -(-total // threads)
    (r0, rvar, rsize), (c0, cvar, csize) = row_axis, col_axis
    with em.block(f"for (int e = 0; e < {per_item}; e++)"):
        em.line(f"const ls_i64 q = lid + {threads} * e;")
        if per_item * threads != total:
            em.line(f"if (q >= {total}) break;")
        pr, pc = (f"q / {cols}", f"q % {cols}") if along_cols else (f"q % {rows}", f"q / {rows}")
        em.line(f"const ls_i64 pr = {pr}, pc = {pc}, gr = {r0} + pr, gc = {c0} + pc;")
        em.line("float v = 0.0f;")
        with em.block(f"if (gr < {rsize} && gc < {csize})"):
            em.bind(rvar, "gr")
            em.bind(cvar, "gc")
            em.line(f"v = {r.expr(factor)};")
        em.line(f"{name}[pr][pc] = v;")
