"""The script language: a compact, lossless text form of MetaSchedule traces.

    encode(mod, trace, target) -> str
    decode(mod, text, target) -> Trace        # raises DecodeError(category, line, column)

One line per instruction: a mnemonic, then its arguments separated by spaces. Outputs are
not written: like `Trace.as_json()`, the decoder names every new random variable in order of
creation with the prefix of its type (`b` block, `l` loop, `v` value), so `b0`, `l3`, `v12`
in an argument are explicit references to earlier results. Arguments that equal their usual
value are omitted from the end of a line. Where the number of outputs depends on the IR
(`L b1 7`: the loops of a block), the count is written, so decoding needs no guessing.

    B matmul                 b0 = get_sblock("matmul")
    L b0 3                   l1, l2, l3 = get_loops(b0)
    T l1 4,1,16,1            v4..v7 = sample_perfect_tile(l1, n=4, decision=[4, 1, 16, 1])
    S l1 v4-7                l8..l11 = split(l1, factors=[v4, v5, v6, v7])
    K 0,16,64,512 2          v12 = sample_categorical([0, 16, 64, 512], uniform, decision=2)
    A b0 ue v12              annotate(b0, "meta_schedule.unroll_explicit", v12)

Any instruction kind without a short form, or whose arguments the short form cannot carry
exactly, is written generically as `!Kind [inputs, attrs, outputs, decision]` (JSON), so the
language covers every trace. The postprocessing section (after `EnterPostproc`) is
deterministic given the sketch, the module and the target (MetaSchedule's postprocessors
make no random choices): it is omitted and re-derived by running the target's
postprocessors; when re-derivation would not reproduce it, it follows a `POST` line
verbatim; `NOPOST` marks a trace that has no postprocessing section.

Decoding checks what the grammar cannot: references to undefined names, tile factors whose
product is not the loop extent, categorical indices out of range, and that the script
applies and postprocesses. Every failure is a `DecodeError` with a category and a position.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from pipeline.space import apply_postprocs
from pipeline.tvm_env import TVM_ERRORS, Schedule, Trace, last_line, tvm

CATEGORIES = (
    "syntax", "unknown_instruction", "undefined_name", "arity", "tile_product",
    "categorical_range", "schedule", "postproc",
)


class DecodeError(ValueError):
    """A script that is not valid. `category` is one of CATEGORIES; `line` and `column` are
    1-based positions in the text (line 0 when the error concerns the whole script)."""

    def __init__(self, category: str, message: str, line: int = 0, column: int = 0):
        assert category in CATEGORIES, category
        self.category, self.line, self.column = category, line, column
        super().__init__(f"{category} at {line}:{column}: {message}")

    @property
    def stage(self) -> str:
        """The correctness stage this failure belongs to (ANCHORS.md's breakdown)."""
        return {"schedule": "apply", "postproc": "postproc"}.get(self.category, "decode")


# ---------------------------------------------------------------------------------------
# Canonical JSON: the form JSONDatabase writes (IntImm/bool as int, FloatImm as float).
# ---------------------------------------------------------------------------------------

def canonical(obj):
    """Plain-Python JSON of a trace's `as_json()` output, comparable with `==`."""
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, tvm.tirx.IntImm):
        return int(obj.value)
    if isinstance(obj, tvm.tirx.FloatImm):
        return float(obj.value)
    if isinstance(obj, (list, tuple)) or type(obj).__name__ == "Array":
        return [canonical(x) for x in obj]
    raise TypeError(f"unexpected value in trace JSON: {type(obj).__name__}")


def trace_to_json(trace: Trace) -> list:
    return canonical(trace.as_json())


# ---------------------------------------------------------------------------------------
# Short forms. A field is (source, index, type, default); source is "in" (input), "in*"
# (inputs from index on, as one list), "attr", "dec" (the decision) or "n" (output count).
# ---------------------------------------------------------------------------------------
NO = object()  # "no default": the field is always written


@dataclass(frozen=True)
class Form:
    mnemonic: str
    fields: tuple
    out: str = ""            # prefix of the outputs
    n_out: object = 0        # int, or "dec" / "factors" / "n" (a field gives it)


FORMS: dict[str, Form] = {
    "GetSBlock": Form("B", (("attr", 0, "str", NO), ("attr", 1, "str", "main")), "b", 1),
    "GetLoops": Form("L", (("in", 0, "ref", NO), ("n", 0, "int", NO)), "l", "n"),
    "GetChildBlocks": Form("CB", (("in", 0, "ref", NO), ("n", 0, "int", NO)), "b", "n"),
    "GetProducers": Form("PR", (("in", 0, "ref", NO), ("n", 0, "int", NO)), "b", "n"),
    "GetConsumers": Form("CO", (("in", 0, "ref", NO), ("n", 0, "int", NO)), "b", "n"),
    "Annotate": Form("A", (("in", 0, "ref", NO), ("attr", 0, "key", NO), ("in", 1, "any", NO))),
    "Unannotate": Form("UA", (("in", 0, "ref", NO), ("attr", 0, "key", NO))),
    "SamplePerfectTile": Form("T", (("in", 0, "ref", NO), ("dec", 0, "ints", NO), ("attr", 1, "int", 64)), "v", "dec"),
    "SampleCategorical": Form("K", (("attr", 0, "ints", NO), ("dec", 0, "int", NO), ("attr", 1, "probs", "uniform")), "v", 1),
    "SampleComputeLocation": Form("CL", (("in", 0, "ref", NO), ("dec", 0, "int", NO)), "l", 1),
    "Split": Form("S", (("in", 0, "ref", NO), ("in*", 1, "refs", NO), ("attr", 0, "bool", 1), ("attr", 1, "bool", 0)), "l", "factors"),
    "Fuse": Form("F", (("in*", 0, "refs", NO), ("attr", 0, "bool", 1)), "l", 1),
    "Reorder": Form("R", (("in*", 0, "refs", NO),)),
    "Parallel": Form("PA", (("in", 0, "ref", NO),)),
    "Vectorize": Form("VE", (("in", 0, "ref", NO),)),
    "Unroll": Form("UR", (("in", 0, "ref", NO),)),
    "Bind": Form("BI", (("in", 0, "ref", NO), ("attr", 0, "axis", NO))),
    "CacheRead": Form("CR", (("in", 0, "ref", NO), ("attr", 0, "int", NO), ("attr", 1, "str", NO), ("in", 1, "refs", ())), "b", 1),
    "CacheWrite": Form("CW", (("in", 0, "ref", NO), ("attr", 0, "int", NO), ("attr", 1, "str", NO), ("in", 1, "refs", ())), "b", 1),
    "ComputeAt": Form("CA", (("in", 0, "ref", NO), ("in", 1, "ref", NO), ("attr", 0, "bool", 1), ("attr", 1, "int", -1))),
    "ReverseComputeAt": Form("RCA", (("in", 0, "ref", NO), ("in", 1, "ref", NO), ("attr", 0, "bool", 1), ("attr", 1, "int", -1))),
    "ComputeInline": Form("CI", (("in", 0, "ref", NO),)),
    "ReverseComputeInline": Form("RCI", (("in", 0, "ref", NO),)),
    "DecomposeReduction": Form("DR", (("in", 0, "ref", NO), ("in", 1, "ref", NO)), "b", 1),
    "RFactor": Form("RF", (("in", 0, "ref", NO), ("attr", 0, "int", NO)), "b", 1),
    "Blockize": Form("BZ", (("in", 0, "ref", NO), ("attr", 0, "bool", 1)), "b", 1),
    "Tensorize": Form("TZ", (("in", 0, "ref", NO), ("attr", 0, "str", NO), ("attr", 1, "bool", 1))),
    "StorageAlign": Form("SA", (("in", 0, "ref", NO), ("attr", 0, "int", NO), ("attr", 1, "int", NO), ("attr", 2, "int", NO), ("attr", 3, "int", NO))),
    "SetScope": Form("SS", (("in", 0, "ref", NO), ("attr", 0, "int", NO), ("attr", 1, "str", NO))),
    "PadEinsum": Form("PE", (("in", 0, "ref", NO), ("attr", 0, "ints", NO))),
    "ReIndex": Form("RX", (("in", 0, "ref", NO), ("attr", 0, "int", NO), ("attr", 1, "int", NO)), "b", 1),
    "AddUnitLoop": Form("AU", (("in", 0, "ref", NO),), "l", 1),
    "EnterPostproc": Form("POST", ()),
}
BY_MNEMONIC = {form.mnemonic: kind for kind, form in FORMS.items()}
assert len(BY_MNEMONIC) == len(FORMS), "mnemonics must be unique"

# Annotation keys MetaSchedule writes (tvm/s_tir/meta_schedule/utils.h, schedule rules).
KEYS = {
    "ts": "meta_schedule.tiling_structure", "par": "meta_schedule.parallel",
    "vec": "meta_schedule.vectorize", "ue": "meta_schedule.unroll_explicit",
    "ui": "meta_schedule.unroll_implicit", "cf": "meta_schedule.cooperative_fetch",
    "tlo": "meta_schedule.thread_extent_low_inclusive", "thi": "meta_schedule.thread_extent_high_inclusive",
    "at": "meta_schedule.auto_tensorize", "ati": "meta_schedule.auto_tensorize_init",
    "rcp": "meta_schedule.random_compute_producer", "lrp": "meta_schedule.layout_rewrite_preproc",
    "pum": "pragma_auto_unroll_max_step", "pue": "pragma_unroll_explicit",
    "sps": "software_pipeline_stage", "spo": "software_pipeline_order",
    "spa": "software_pipeline_async_stages", "we": "warp_execution",
}
# Only keys MetaSchedule's rules, mutators and postprocessors write may be annotated: a script
# must not attach e.g. `pragma_import_llvm` / `pragma_import_c`, which link arbitrary IR or a
# file into the kernel (tvm/s_tir/stmt.h lists the schedule attributes).
ALLOWED_KEYS = frozenset(KEYS.values()) | {
    "meta_schedule.inline_rule", "double_buffer_scope", "auto_copy", "local_stage", "vector_bytes"}
# No block has anywhere near this many loops or outputs; a count above it is refused before
# any name is allocated (a script like `L b0 999999999` must not exhaust memory).
MAX_COUNT = 1024
AXES = {f"{a}{d}": f"{name}.{d}" for a, name in (("b", "blockIdx"), ("t", "threadIdx"), ("v", "vthread")) for d in "xyz"}
_KEYS_INV = {v: k for k, v in KEYS.items()}
_AXES_INV = {v: k for k, v in AXES.items()}
_NAME = re.compile(r"^([blv])(\d+)$")
_RANGE = re.compile(r"^([blv])(\d+)-(\d+)$")
_INT = re.compile(r"^-?\d+$")
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[[^\s]*\]|\S+')


def _uniform(n: int) -> list[float]:
    # MetaSchedule's rules build FloatImm(float32, 1.0 / n); the value keeps double precision.
    return [1.0 / n] * n


# ---------------------------------------------------------------------------------------
# Index maps (TransformLayout / TransformBlockLayout, CUDA tensor-core sketches). The trace
# carries them as TVM JSON graphs (~2 kB each); here they are written as a compact string
# `@i0,i1>((i0//16)//(v28*v29)),...` (`@@` when the trace stored the graph indented).
# Free variables (v28) are the trace's own sampled values. Encoding is kept only when the
# expansion reproduces the stored JSON byte for byte.
# ---------------------------------------------------------------------------------------
_IM_OPS = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%"}
_IM_TOKEN = re.compile(r"\s*(//|[()+\-*%,]|#\d+|[A-Za-z_][A-Za-z0-9_]*(?::[a-z0-9]+)?|\d+(?::[a-z0-9]+)?)")


def _im_atom(name: str, dtype: str) -> str:
    return name if dtype == "int32" else f"{name}:{dtype}"


def _im_expr(e, seen: list) -> str:
    """Post-order print; a node object met again (TVM shares some subexpressions, and the
    JSON graph keeps that sharing) is written `#k`, k its post-order number."""
    kind = type(e).__name__
    if kind == "Var":
        return _im_atom(e.name, str(e.ty))
    for k, other in enumerate(seen):
        if e.same_as(other):
            return f"#{k}"
    if kind == "IntImm":
        text = _im_atom(str(int(e.value)), str(e.ty))
    elif kind in _IM_OPS:
        text = f"({_im_expr(e.a, seen)}{_IM_OPS[kind]}{_im_expr(e.b, seen)})"
    else:
        raise _NoShortForm
    seen.append(e)
    return text


def compact_index_map(graph: str) -> str:
    """TVM JSON graph of an IndexMap -> compact text; raises _NoShortForm if not exact."""
    try:
        im = tvm.ir.load_json(graph)
    except TVM_ERRORS:
        raise _NoShortForm from None
    if type(im).__name__ != "IndexMap" or im.inverse_index_map is not None:
        raise _NoShortForm
    seen: list = []
    text = ("@@" if "\n" in graph else "@") + ",".join(_im_expr(v, seen) for v in im.initial_indices) + ">" + \
        ",".join(_im_expr(e, seen) for e in im.final_indices)
    if expand_index_map(text) != graph:
        raise _NoShortForm
    return text


def expand_index_map(text: str) -> str:
    """Compact text -> the exact TVM JSON graph string."""
    indented = text.startswith("@@")
    body = text[2:] if indented else text[1:]
    if ">" not in body:
        raise _Bad("syntax", "an index map is @inputs>outputs")
    head, tail = body.split(">", 1)
    variables: dict[str, object] = {}
    nodes: list = []  # post-order, as the printer numbered them

    def var(tok: str):
        name, _, dtype = tok.partition(":")
        if name not in variables:
            variables[name] = tvm.tirx.Var(name, dtype or "int32")
        return variables[name]

    def parse_list(src: str) -> list:
        toks = [t for t in _IM_TOKEN.findall(src)]
        if "".join(toks) != src.replace(" ", ""):
            raise _Bad("syntax", f"bad index map {src!r}")
        pos = [0]

        def expr():
            if pos[0] >= len(toks):
                raise _Bad("syntax", "truncated index map")
            tok = toks[pos[0]]
            pos[0] += 1
            if tok == "(":
                a = expr()
                op = toks[pos[0]] if pos[0] < len(toks) else ""
                pos[0] += 1
                b = expr()
                if pos[0] >= len(toks) or toks[pos[0]] != ")":
                    raise _Bad("syntax", "unbalanced index map")
                pos[0] += 1
                ctor = {v: k for k, v in _IM_OPS.items()}.get(op)
                if ctor is None:
                    raise _Bad("syntax", f"unknown index map operator {op!r}")
                nodes.append(getattr(tvm.tirx, ctor)(a, b))
                return nodes[-1]
            if tok[0] == "#":
                k = int(tok[1:])
                if k >= len(nodes):
                    raise _Bad("syntax", f"index map reference {tok} to a node not yet written")
                return nodes[k]
            if tok[0].isdigit():
                value, _, dtype = tok.partition(":")
                nodes.append(tvm.tirx.IntImm(dtype or "int32", int(value)))
                return nodes[-1]
            if tok[0].isalpha() or tok[0] == "_":
                return var(tok)
            raise _Bad("syntax", f"unexpected {tok!r} in index map")

        out = []
        while pos[0] < len(toks):
            out.append(expr())
            if pos[0] < len(toks):
                if toks[pos[0]] != ",":
                    raise _Bad("syntax", "index map items are separated by commas")
                pos[0] += 1
        return out

    try:
        initial = parse_list(head)
        final = parse_list(tail)
        graph = tvm.ir.save_json(tvm.tirx.IndexMap(initial, final, None))
    except TVM_ERRORS as err:
        raise _Bad("syntax", f"bad index map: {(last_line(err) or type(err).__name__)[:200]}") from None
    return json.dumps(json.loads(graph), indent=2) if indented else graph


def _compact_strings(value):
    """Generic-form arguments with index maps written compactly (exactly reversible)."""
    if isinstance(value, list):
        return [_compact_strings(v) for v in value]
    if isinstance(value, str) and value.startswith("{") and "tirx.IndexMap" in value:
        try:
            return compact_index_map(value)
        except _NoShortForm:
            return value
    return value


def _expand_strings(value):
    if isinstance(value, list):
        return [_expand_strings(v) for v in value]
    if isinstance(value, str) and value.startswith("@"):
        return expand_index_map(value)
    return value


# ---------------------------------------------------------------------------------------
# Values <-> tokens
# ---------------------------------------------------------------------------------------

def _is_ref(x) -> bool:
    return isinstance(x, str) and bool(_NAME.match(x))


def _quote(s: str) -> str:
    return json.dumps(s)


def _enc_str(s) -> str:
    if not isinstance(s, str):
        raise _NoShortForm
    return s if _BARE.match(s) and s not in ("_", "-") else _quote(s)


def _enc_refs(items) -> str:
    if not isinstance(items, list):
        raise _NoShortForm
    if not items:
        return "-"
    out, i = [], 0
    while i < len(items):
        x = items[i]
        if x is None or x == "None":  # a free split factor is stored as the string "None"
            out.append("_")
        elif isinstance(x, int) and not isinstance(x, bool):
            out.append(str(x))
        elif _is_ref(x):
            p, n = _NAME.match(x).groups()
            j = i
            while j + 1 < len(items) and items[j + 1] == f"{p}{int(n) + j + 1 - i}":
                j += 1
            out.append(f"{x}-{int(n) + j - i}" if j - i >= 2 else x)
            if 0 < j - i < 2:
                out.extend(items[i + 1:j + 1])
            i = j
        else:
            raise _NoShortForm
        i += 1
    return ",".join(out)


def _enc_any(x) -> str:
    """An Annotate value: a reference, a number, a string or a list."""
    if isinstance(x, bool):
        raise _NoShortForm
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return repr(x) if ("." in repr(x) or "e" in repr(x)) else repr(x) + ".0"
    if isinstance(x, str):
        if _is_ref(x):
            return x
        if len(x) >= 2 and x[0] == '"' and x[-1] == '"':  # a string literal, stored quoted
            return x
        raise _NoShortForm
    if isinstance(x, list):
        return json.dumps(x, separators=(",", ":"))
    raise _NoShortForm


def _encode_field(typ: str, value) -> str:
    if typ == "ref":
        if not _is_ref(value):
            raise _NoShortForm
        return value
    if typ == "refs":
        return _enc_refs(value)
    if typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _NoShortForm
        return str(value)
    if typ == "bool":
        if value not in (0, 1) or isinstance(value, float):
            raise _NoShortForm
        return str(int(value))
    if typ == "ints":
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise _NoShortForm
        return ",".join(map(str, value)) if value else "-"
    if typ == "probs":
        if not isinstance(value, list) or not all(isinstance(v, float) for v in value):
            raise _NoShortForm
        return ",".join(repr(v) for v in value)
    if typ == "str":
        return _enc_str(value)
    if typ == "key":
        return _KEYS_INV.get(value) or _quote(value) if isinstance(value, str) else _raise()
    if typ == "axis":
        return _AXES_INV.get(value) or _quote(value) if isinstance(value, str) else _raise()
    if typ == "any":
        return _enc_any(value)
    raise AssertionError(typ)


def _raise():
    raise _NoShortForm


class _NoShortForm(Exception):
    """The short form cannot carry this instruction exactly: use the generic form."""


# ---------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------

def _encode_inst(inst: list, decision) -> str:
    kind, inputs, attrs, outputs = inst
    form = FORMS.get(kind)
    if form is not None:
        try:
            line = _encode_short(form, inputs, attrs, outputs, decision)
            # Self-check: the short form must parse back to this very instruction.
            if _parse_short_values(form, [t for t, _ in _tokens(line)[1:]], kind) == (inputs, attrs, len(outputs), decision):
                return line
        except (_NoShortForm, _Bad):
            pass
    # compact_index_map keeps a compact form only if it expands to the same JSON exactly.
    return "!" + kind + " " + json.dumps(
        [_compact_strings(inputs), _compact_strings(attrs), outputs, decision], separators=(",", ":"))


def _encode_short(form: Form, inputs, attrs, outputs, decision) -> str:
    tokens: list[str] = []
    defaults: list[bool] = []
    for src, idx, typ, default in form.fields:
        if src == "in":
            if idx >= len(inputs):
                raise _NoShortForm
            value = inputs[idx]
        elif src == "in*":
            value = inputs[idx:]
        elif src == "attr":
            if idx >= len(attrs):
                raise _NoShortForm
            value = attrs[idx]
        elif src == "dec":
            if decision is None:
                raise _NoShortForm
            value = decision
        else:  # "n"
            value = len(outputs)
        if default == "uniform":
            is_default = isinstance(value, list) and len(value) > 0 and value == _uniform(len(value))
        elif default is NO:
            is_default = False
        else:
            is_default = value == (list(default) if isinstance(default, tuple) else default)
        tokens.append(_encode_field(typ, value))
        defaults.append(is_default)
    while defaults and defaults[-1]:
        defaults.pop()
        tokens.pop()
    return " ".join([form.mnemonic] + tokens)


def encode(mod: "tvm.IRModule", trace: Trace, target: "tvm.target.Target", verify: bool = True) -> str:
    """The script text of `trace`. With `verify`, the postprocessing section is omitted only
    after checking that decoding re-derives it exactly; otherwise it is written out."""
    insts, decisions = trace_to_json(trace)
    return encode_json(mod, [insts, decisions], target, verify)


def encode_json(mod, trace_json: list, target, verify: bool = True) -> str:
    insts, decisions = trace_json
    by_index = {int(i): d for i, d in decisions}
    lines = [_encode_inst(inst, by_index.get(i)) for i, inst in enumerate(insts)]
    post = next((i for i, inst in enumerate(insts) if inst[0] == "EnterPostproc"), None)
    if post is None:
        return "\n".join(lines + ["NOPOST"])
    sketch = "\n".join(lines[:post])
    if verify:
        try:
            derived = trace_to_json(decode(mod, sketch, target))
        except DecodeError:
            derived = None
        if derived != [insts, [[int(i), d] for i, d in decisions]]:
            return "\n".join(lines)  # lines[post] is "POST": explicit postprocessing
    return sketch


# ---------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------

class _Env:
    """Names defined so far, in TVM's order-of-creation naming."""

    def __init__(self):
        self.names: set[str] = set()
        self.count = 0

    def new(self, prefix: str, n: int) -> list[str]:
        out = [f"{prefix}{self.count + i}" for i in range(n)]
        self.count += n
        self.names.update(out)
        return out


def _tokens(line: str) -> list[tuple[str, int]]:
    return [(m.group(0), m.start() + 1) for m in _TOKEN.finditer(line)]


def _dec_str(tok: str) -> str:
    if tok.startswith('"'):
        try:
            value = json.loads(tok)
        except json.JSONDecodeError:
            raise _Bad("syntax", f"bad string {tok}") from None
        if not isinstance(value, str):
            raise _Bad("syntax", f"bad string {tok}")
        return value
    if not _BARE.match(tok):
        raise _Bad("syntax", f"expected a name or a quoted string, got {tok!r}")
    return tok


class _Bad(Exception):
    def __init__(self, category: str, message: str):
        self.category, self.message = category, message


def _dec_int(tok: str) -> int:
    if not _INT.match(tok):
        raise _Bad("syntax", f"expected an integer, got {tok!r}")
    return int(tok)


def _dec_refs(tok: str) -> list:
    if tok == "-":
        return []
    out: list = []
    for item in tok.split(","):
        if item == "_":
            out.append("None")
        elif _INT.match(item):
            out.append(int(item))
        elif _NAME.match(item):
            out.append(item)
        elif _RANGE.match(item):
            p, a, b = _RANGE.match(item).groups()
            if int(b) <= int(a):
                raise _Bad("syntax", f"empty range {item!r}")
            if int(b) - int(a) >= MAX_COUNT:
                raise _Bad("arity", f"range {item!r} names more than {MAX_COUNT} variables")
            out.extend(f"{p}{k}" for k in range(int(a), int(b) + 1))
        else:
            raise _Bad("syntax", f"expected references, got {item!r}")
    return out


def _decode_field(typ: str, tok: str):
    if typ == "ref":
        if not _NAME.match(tok):
            raise _Bad("syntax", f"expected a reference like b0/l1/v2, got {tok!r}")
        return tok
    if typ == "refs":
        return _dec_refs(tok)
    if typ == "int":
        return _dec_int(tok)
    if typ == "bool":
        if tok not in ("0", "1"):
            raise _Bad("syntax", f"expected 0 or 1, got {tok!r}")
        return int(tok)
    if typ == "ints":
        return [] if tok == "-" else [_dec_int(t) for t in tok.split(",")]
    if typ == "probs":
        try:
            values = [float(t) for t in tok.split(",")]
        except ValueError:
            raise _Bad("syntax", f"expected probabilities, got {tok!r}") from None
        if not all(math.isfinite(v) for v in values):
            raise _Bad("syntax", f"probabilities must be finite, got {tok!r}")
        return values
    if typ == "str":
        return _dec_str(tok)
    if typ == "key":
        return KEYS.get(tok) or _dec_str(tok) if tok in KEYS or tok.startswith('"') else _bad_key(tok)
    if typ == "axis":
        return AXES.get(tok) or _dec_str(tok) if tok in AXES or tok.startswith('"') else _bad_axis(tok)
    if typ == "any":
        if _NAME.match(tok) or _INT.match(tok):
            return int(tok) if _INT.match(tok) else tok
        if tok.startswith('"'):
            _dec_str(tok)
            return tok  # string literals stay quoted inside trace inputs
        if tok.startswith("["):
            try:
                return json.loads(tok)
            except json.JSONDecodeError:
                raise _Bad("syntax", f"bad list {tok!r}") from None
        try:
            value = float(tok)
        except ValueError:
            raise _Bad("syntax", f"bad annotation value {tok!r}") from None
        if not math.isfinite(value):
            raise _Bad("syntax", f"annotation value must be finite, got {tok!r}")
        return value
    raise AssertionError(typ)


def _bad_key(tok):
    raise _Bad("syntax", f"unknown annotation key {tok!r}; quote a full key, e.g. \"pragma_x\"")


def _bad_axis(tok):
    raise _Bad("syntax", f"unknown thread axis {tok!r}; use bx..bz, tx..tz, vx..vz or a quoted name")


def _parse_short_values(form: Form, toks: list[str], kind: str):
    """Tokens of a short form -> (inputs, attrs, n_outputs, decision)."""
    n_required = sum(1 for f in form.fields if f[3] is NO)
    if not n_required <= len(toks) <= len(form.fields):
        raise _Bad("arity", f"{form.mnemonic} takes {n_required} to {len(form.fields)} arguments, got {len(toks)}")
    inputs: dict[int, object] = {}
    star: list = []
    attrs: dict[int, object] = {}
    decision = None
    n_out = form.n_out if isinstance(form.n_out, int) else None
    for i, (src, idx, typ, default) in enumerate(form.fields):
        if i < len(toks):
            value = _decode_field(typ, toks[i])
        elif default == "uniform":
            value = "uniform"
        else:
            value = list(default) if isinstance(default, tuple) else default
        if src == "in":
            inputs[idx] = value
        elif src == "in*":
            star = value
        elif src == "attr":
            attrs[idx] = value
        elif src == "dec":
            decision = value
        else:
            if not 0 <= value <= MAX_COUNT:
                raise _Bad("arity", f"output count must be in [0, {MAX_COUNT}], got {value}")
            n_out = value
    if kind == "SamplePerfectTile":
        if not decision:
            raise _Bad("arity", "a tile needs at least one factor")
        attrs[0] = len(decision)
    if kind == "SampleCategorical":
        if attrs.get(1) == "uniform":
            attrs[1] = _uniform(len(attrs[0])) if attrs[0] else []
        if len(attrs[1]) != len(attrs[0]):
            raise _Bad("arity", f"{len(attrs[0])} candidates but {len(attrs[1])} probabilities")
        if not 0 <= decision < len(attrs[0]):
            raise _Bad("categorical_range", f"decision {decision} is not an index into {len(attrs[0])} candidates")
    in_list = [inputs[k] for k in sorted(inputs)] + star
    attr_list = [attrs[k] for k in sorted(attrs)]
    if form.n_out == "dec":
        n_out = len(decision)
    elif form.n_out == "factors":
        n_out = len(star)
    return in_list, attr_list, n_out, decision


def _check_refs(value, env: _Env, quoted_ok: bool):
    """Every bare name in `value` must be defined. Quoted strings are literals."""
    if isinstance(value, list):
        for v in value:
            _check_refs(v, env, quoted_ok)
    elif isinstance(value, str):
        if value.startswith('"') or value == "None":  # literal string / free split factor
            return
        if _NAME.match(value) and value not in env.names:
            raise _Bad("undefined_name", f"{value} is not defined before this line")
        if not _NAME.match(value) and not quoted_ok:
            raise _Bad("syntax", f"unexpected bare string {value!r}")


def parse(text: str) -> tuple[list, list, str, list[int]]:
    """Text -> (instructions as JSON, decisions, postproc mode, line number per instruction).
    Mode: "derive" (re-derive postprocessing), "explicit" (a POST section) or "none"."""
    if not isinstance(text, str):
        raise DecodeError("syntax", f"a script is text, got {type(text).__name__}")
    env = _Env()
    insts: list = []
    decisions: list = []
    lines: list[int] = []
    mode = "derive"
    raw_lines = text.split("\n")
    if raw_lines and raw_lines[-1] == "":
        raw_lines.pop()
    if not raw_lines:
        raise DecodeError("syntax", "empty script", 1, 1)
    for lineno, line in enumerate(raw_lines, start=1):
        if mode == "none":
            raise DecodeError("syntax", "nothing may follow NOPOST", lineno, 1)
        toks = _tokens(line)
        if not toks:
            raise DecodeError("syntax", "empty line", lineno, 1)
        head, col = toks[0]
        try:
            if head == "NOPOST":
                if len(toks) > 1 or mode == "explicit":
                    raise _Bad("syntax", "NOPOST stands alone, and not after POST")
                mode = "none"
                continue
            if head.startswith("!"):
                kind = head[1:]
                inst, decision = _parse_generic(kind, line[len(head):].strip(), env)
            else:
                kind = BY_MNEMONIC.get(head)
                if kind is None:
                    raise _Bad("unknown_instruction", f"unknown instruction {head!r}")
                inputs, attrs, n_out, decision = _parse_short_values(FORMS[kind], [t for t, _ in toks[1:]], kind)
                _check_refs(inputs, env, quoted_ok=False)
                inst = [kind, inputs, attrs, env.new(FORMS[kind].out, n_out)]
            if kind in ("Annotate", "Unannotate"):
                _check_key(inst[2][0] if inst[2] else None)
            if kind == "EnterPostproc":
                if mode == "explicit":
                    raise _Bad("syntax", "POST appears twice")
                mode = "explicit"
        except _Bad as bad:
            raise DecodeError(bad.category, bad.message, lineno, col) from None
        if decision is not None:
            decisions.append([len(insts), decision])
        insts.append(inst)
        lines.append(lineno)
    return insts, decisions, mode, lines


def _check_key(key) -> None:
    value = key.strip('"') if isinstance(key, str) else key
    if value not in ALLOWED_KEYS:
        raise _Bad("syntax", f"annotation key {key!r} is not one MetaSchedule writes")


def _parse_generic(kind: str, rest: str, env: _Env):
    try:
        kind_obj = tvm.s_tir.schedule.InstructionKind.get(kind)
    except TVM_ERRORS:
        kind_obj = None
    if kind_obj is None or not kind:
        raise _Bad("unknown_instruction", f"unknown instruction kind {kind!r}")
    try:
        body = json.loads(rest)
    except json.JSONDecodeError as err:
        raise _Bad("syntax", f"generic form needs JSON [inputs, attrs, outputs, decision]: {err.msg}") from None
    if not (isinstance(body, list) and len(body) == 4 and isinstance(body[0], list)
            and isinstance(body[1], list) and isinstance(body[2], list)):
        raise _Bad("arity", "generic form is [inputs, attrs, outputs, decision]")
    inputs, attrs, outputs, decision = body
    inputs, attrs = _expand_strings(inputs), _expand_strings(attrs)
    _check_refs(inputs, env, quoted_ok=True)
    if len(outputs) > MAX_COUNT:
        raise _Bad("arity", f"more than {MAX_COUNT} outputs")
    expected_numbers = list(range(env.count, env.count + len(outputs)))
    for name, number in zip(outputs, expected_numbers):
        m = _NAME.match(name) if isinstance(name, str) else None
        if not m or int(m.group(2)) != number:
            raise _Bad("syntax", f"output {name!r} should be named {'{b,l,v}'}{number}")
    env.count += len(outputs)
    env.names.update(outputs)
    return [kind, inputs, attrs, outputs], decision


def _apply_json(mod, insts: list, decisions: list) -> Schedule:
    sch = Schedule(mod, debug_mask=0)
    Trace.apply_json_to_schedule([insts, decisions], sch)
    return sch


def _first_error(mod, insts, decisions) -> tuple[int, str]:
    """Index of the first instruction whose application fails, and TVM's message (bisection)."""
    lo, hi, message = 0, len(insts), ""
    while lo < hi:  # invariant: prefix of length lo applies; prefix of length hi+1 fails
        mid = (lo + hi) // 2
        prefix = [d for d in decisions if d[0] <= mid]
        try:
            _apply_json(mod, insts[: mid + 1], prefix)
            lo = mid + 1
        except TVM_ERRORS as err:
            hi, message = mid, _first_line(err)
    return lo, message


def _first_line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    useful = [ln for ln in lines if "Error" in ln or "error" in ln] or lines or [type(err).__name__]
    return useful[-1][:300]


def decode(mod: "tvm.IRModule", text: str, target: "tvm.target.Target") -> Trace:
    """The exact trace a script stands for (postprocessing included), applied to `mod`."""
    insts, decisions, mode, lines = parse(text)
    for i, d in decisions:
        # TVM divides by tile factors: a zero would kill the process (SIGFPE), not raise.
        if insts[i][0] in ("SamplePerfectTile", "SamplePartitionedTile") and any(int(x) < 1 for x in d):
            raise DecodeError("tile_product", f"tile factors must be positive integers, got {list(d)}", lines[i], 1)
    try:
        first = _apply_json(mod, insts, decisions)
    except TVM_ERRORS:
        index, message = _first_error(mod, insts, decisions)
        raise DecodeError("schedule", message or "the instruction does not apply", lines[min(index, len(lines) - 1)], 1) from None

    # Second pass: replay the recorded trace, checking the script's own decisions where TVM
    # accepts what MetaSchedule never produces. (TVM silently replaces perfect-tile factors
    # that do not multiply to the loop extent, so the check must use the text's factors.)
    written = {i: d for i, d in decisions}
    sch = Schedule(mod, debug_mask=0)
    problems: list[tuple[int, str]] = []
    position = [0]

    def check(inst, inputs, attrs, decision):
        i = position[0]
        position[0] += 1
        if inst.kind.name == "SamplePerfectTile" and i in written and not problems:
            extent = sch.get(inputs[0]).extent
            if isinstance(extent, tvm.tirx.IntImm):
                product = math.prod(int(d) for d in written[i])
                if product != int(extent.value):
                    problems.append((i, f"tile factors multiply to {product}, loop extent is {int(extent.value)}"))
        return decision

    try:
        first.trace.apply_to_schedule(sch, remove_postproc=(mode != "explicit"), decision_provider=check)
    except TVM_ERRORS as err:
        raise DecodeError("schedule", _first_line(err), lines[min(position[0] - 1, len(lines) - 1)], 1) from None
    if problems:
        index, message = problems[0]
        raise DecodeError("tile_product", message, lines[index], 1)
    if mode == "derive" and not apply_postprocs(sch, target):
        raise DecodeError("postproc", "a postprocessor rejected the schedule (e.g. VerifyGPUCode)", len(lines), 1)
    return sch.trace


def canonical_script(trace: Trace) -> str:
    """A schedule's script in the one form the pipeline trains on and the guided decoder
    writes: the sketch part, simplified as MetaSchedule's database keeps it (dead pure
    instructions dropped), postprocessing left to be re-derived by `decode`."""
    insts, decisions = trace_to_json(trace.simplified(remove_postproc=True))
    by_index = {int(i): d for i, d in decisions}
    return "\n".join(_encode_inst(inst, by_index.get(i)) for i, inst in enumerate(insts))


def canonical_from_json(mod, trace_json: list) -> str:
    """`canonical_script` of a stored trace (a tuning record's JSON), replayed on `mod`."""
    sch = Schedule(mod, debug_mask=0)
    try:
        Trace.apply_json_to_schedule(trace_json, sch)
    except TVM_ERRORS as err:
        raise DecodeError("schedule", _first_line(err)) from None
    return canonical_script(sch.trace)


def round_trips(mod, trace: Trace, target, text: str | None = None) -> bool:
    """True when decode(encode(trace)) is exactly `trace` (canonical JSON and Python form);
    with `text`, also that `text` is what `trace` encodes to."""
    encoded = encode(mod, trace, target)
    if text is not None and encoded != text:
        return False
    try:
        back = decode(mod, encoded, target)
    except DecodeError:
        return False
    return trace_to_json(back) == trace_to_json(trace) and back.as_python() == trace.as_python()
