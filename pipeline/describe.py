"""A compact description of *any* PrimFunc, the model's view of a kernel.

Derived from the IR alone (never from catalog family names), so a user's own kernel is
described the same way: the arguments (shape, dtype), then every block with its iterators
(kind S spatial / R reduction / O other, and extent), what it reads and writes with the index
expressions, and whether it has a reduction init. Example:

    args: A f16[2,256] B f16[256,64] matmul_cast f16[2,64]
    block matmul: i S2 j S64 r R256 | init | reads A[i,r] B[r,j] | writes matmul[i,j] | f32
    block matmul_cast: i S2 j S64 | reads matmul[i,j] | writes matmul_cast[i,j] | f16
"""

from __future__ import annotations

import re

from pipeline.tvm_env import TVM_ERRORS, Schedule, last_line, tvm

_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32",
          "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "b"}
_KIND = {0: "S", 2: "R"}


class DescribeError(ValueError):
    """The module is not a single-PrimFunc TIR kernel the pipeline can describe."""


def _dtype(d) -> str:
    return _DTYPE.get(str(d), str(d))


def _index(expr, names: dict[str, str]) -> str:
    text = str(expr)
    text = re.sub(r"T\.int\d+\((-?\d+)\)", r"\1", text)
    for var, short in names.items():
        text = re.sub(rf"\b{re.escape(var)}\b", short, text)
    return text.replace(" ", "")


def describe(mod: "tvm.IRModule") -> str:
    if not isinstance(mod, tvm.IRModule) or len(mod.functions) != 1:
        raise DescribeError("expected an IRModule with exactly one PrimFunc")
    try:
        sch = Schedule(mod, debug_mask=0)
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
    except TVM_ERRORS as err:
        raise DescribeError(f"cannot read the kernel's blocks: {last_line(err) or type(err).__name__}") from None
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    func = mod[mod.get_global_vars()[0]]
    params = [p.name for p in func.params]
    infos = ArgInfo.from_prim_func(func)
    lines = ["args: " + " ".join(
        f"{n} {_dtype(a.dtype)}[{','.join(str(int(s)) for s in a.shape)}]" for n, a in zip(params, infos))]
    for rv in blocks:
        block = sch.get(rv)
        names = {iv.var.name: iv.var.name.removeprefix("v_") for iv in block.iter_vars}
        iters = " ".join(f"{names[iv.var.name]} {_KIND.get(int(iv.iter_type), 'O')}{_extent(iv.dom.extent)}"
                         for iv in block.iter_vars)
        reads = " ".join(f"{r.source.name}[{','.join(_index(x.min, names) for x in r.region)}]" for r in block.reads)
        writes = " ".join(f"{w.source.name}[{','.join(_index(x.min, names) for x in w.region)}]" for w in block.writes)
        out_dtype = _dtype(block.writes[0].source.dtype) if block.writes else "-"
        parts = [f"block {block.name_hint}: {iters}"]
        if block.init is not None:
            parts.append("init")
        parts += [f"reads {reads}" if reads else "reads -", f"writes {writes}", out_dtype]
        lines.append(" | ".join(parts))
    return "\n".join(lines)


def _extent(e) -> str:
    return str(int(e.value)) if isinstance(e, tvm.tirx.IntImm) else str(e)
