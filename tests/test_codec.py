"""The script language: exact round trips on real traces of both targets, and malformed input."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from pipeline import codec
from pipeline.codec import DecodeError, decode, encode, trace_to_json
from pipeline.space import SpaceError, sample_many
from pipeline.workloads import FAMILIES, build, catalog


def _sample_traces(target, families, workloads_per_family, samples, seed=0):
    specs = catalog(seed)
    out = []
    for fam in families:
        for spec in [s for s in specs if s.family == fam][:workloads_per_family]:
            mod = build(spec)
            try:
                schedules = sample_many(mod, target, samples, seed=seed)
            except SpaceError:
                continue
            out.extend((spec, mod, s.trace) for s in schedules)
    return out


def _assert_round_trips(traces, target):
    families = set()
    for spec, mod, trace in traces:
        text = encode(mod, trace, target)
        back = decode(mod, text, target)
        assert trace_to_json(back) == trace_to_json(trace), (spec.id, text)
        assert back.as_python() == trace.as_python(), spec.id
        families.add(spec.family)
    return families


def _build(mod, trace, target):
    from pipeline.tvm_env import Schedule, tvm

    sch = Schedule(mod, debug_mask=0)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return tvm.compile(sch.mod, target=target)


def _builds_of_decoded(traces, target, per_family_limit):
    """For each family, the first trace whose original builds: the decoded one must build too.
    (Some sampled CUDA fp16 tensor-core traces fail in TVM's own lowering, decoded or not:
    "tvm_access_ptr element type must match", as GPU.md records.)"""
    from pipeline.tvm_env import TVM_ERRORS

    built = {}
    for spec, mod, trace in traces:
        if spec.family in built or len(built) >= per_family_limit:
            continue
        try:
            _build(mod, trace, target)
        except TVM_ERRORS:
            continue
        built[spec.family] = _build(mod, decode(mod, encode(mod, trace, target), target), target)
    return built


# One test per target: sampling >1,000 traces is the expensive part, done once each.
# Together: >= 600 CPU + >= 400 CUDA traces, i.e. more than 1,000.

@pytest.mark.slow     # ~100 s: the default run keeps under 15 min (CI runs it in its slow phase)
def test_cpu_traces_round_trip_exactly_and_build(cpu_target):
    traces = _sample_traces(cpu_target, sorted(FAMILIES), 5, 8)
    families = _assert_round_trips(traces, cpu_target)
    assert len(traces) >= 600 and len(families) >= 12
    built = _builds_of_decoded(traces, cpu_target, len(FAMILIES))
    assert len(built) >= 12 and all(ex.mod is not None for ex in built.values())


def test_postprocessing_is_derived_not_written(matmul_mod, cpu_target):
    trace = sample_many(matmul_mod, cpu_target, 1, seed=7)[0].trace
    text = encode(matmul_mod, trace, cpu_target)
    assert "sch.enter_postproc()" in "\n".join(trace.as_python())
    assert "POST" not in text.split("\n")
    assert len(text) < 0.25 * len("\n".join(trace.as_python()))


def test_explicit_postproc_when_not_derivable(matmul_mod, cpu_target):
    """A trace whose postprocessing section differs from what the postprocessors derive
    is still encoded exactly: the section is written after POST."""
    insts, decisions = trace_to_json(sample_many(matmul_mod, cpu_target, 1, seed=8)[0].trace)
    # Drop the last postprocessing instruction: no longer what the postprocessors produce.
    truncated = [insts[:-1], [d for d in decisions if d[0] < len(insts) - 1]]
    text = codec.encode_json(matmul_mod, truncated, cpu_target)
    assert "POST" in text.split("\n")
    assert trace_to_json(decode(matmul_mod, text, cpu_target)) == truncated


# --------------------------------------------------------------------------- malformed input

def _valid_script(mod, target):
    return encode(mod, sample_many(mod, target, 1, seed=3)[0].trace, target)


@pytest.mark.parametrize("text,category", [
    ("", "syntax"),
    ("\n\n", "syntax"),
    ("FOO b0", "unknown_instruction"),
    ("!NoSuchKind [[],[],[],null]", "unknown_instruction"),
    ("L b9 3", "undefined_name"),
    ("B matmul\nL b0 3\nS l5 v2-3", "undefined_name"),
    ("B matmul\nL b0 3\nT l1 2,8,8", "tile_product"),
    ("K 0,16,64 5", "categorical_range"),
    ("K 0,16,64 -1", "categorical_range"),
    ("B matmul\nL b0", "arity"),
    ("B matmul\nL b0 3 4 5", "arity"),
    ("B matmul\nL b0 x", "syntax"),
    ("B matmul\nL b0 3\nS l1 v2-", "syntax"),
    ('B "unterminated', "syntax"),
    ("B nosuchblock", "schedule"),
    ("B matmul\nL b0 3\nF l3,l1", "schedule"),
    ("!Split [1,2]", "arity"),
    ('B matmul\n!TransformLayout [["b0","@v_i,v_j>(v_i//"],[0,0,null,1],[],null]', "syntax"),
    ('B matmul\n!TransformLayout [["b0","@v_i,v_j>#3"],[0,0,null,1],[],null]', "syntax"),
    ('B matmul\n!TransformLayout [["b0","@v_i,v_j"],[0,0,null,1],[],null]', "syntax"),
    ("!Split {not json", "syntax"),
])
def test_malformed_scripts_raise_decode_error(matmul_mod, cpu_target, text, category):
    with pytest.raises(DecodeError) as info:
        decode(matmul_mod, text, cpu_target)
    assert info.value.category == category, str(info.value)
    assert info.value.line >= 0 and info.value.column >= 0


def test_zero_tile_factor_is_a_decode_error_not_a_crash(matmul_mod, cpu_target):
    """TVM divides by tile factors: a 0 used to kill the process with SIGFPE."""
    lines = _valid_script(matmul_mod, cpu_target).split("\n")
    i = next(k for k, ln in enumerate(lines) if ln.startswith("T "))
    head, factors = lines[i].rsplit(" ", 1)
    lines[i] = head + " " + ",".join(["0"] + factors.split(",")[1:])
    with pytest.raises(DecodeError) as err:
        decode(matmul_mod, "\n".join(lines[: i + 1] + ["NOPOST"]), cpu_target)
    assert err.value.category == "tile_product" and err.value.line == i + 1


def test_error_positions_point_at_the_line(matmul_mod, cpu_target):
    with pytest.raises(DecodeError) as info:
        decode(matmul_mod, "B matmul\nL b0 3\nT l1 1,2,8\nT l2 2,8,8", cpu_target)
    assert (info.value.category, info.value.line) == ("tile_product", 4)


def test_truncated_scripts_never_crash(matmul_mod, cpu_target):
    text = _valid_script(matmul_mod, cpu_target)
    rng = random.Random(0)
    for cut in sorted(rng.sample(range(1, len(text)), 60)):
        try:
            decode(matmul_mod, text[:cut], cpu_target)
        except DecodeError as err:
            assert err.category in codec.CATEGORIES


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("BLTSKAFR!0123456789,-_ \n\"[]{}blvx:.=")), max_size=60))
def test_random_text_only_raises_decode_error(text):
    from pipeline.tvm_env import make_target
    from pipeline.workloads import Spec

    mod = build(Spec("matmul", (16, 256, 256), "float32"))
    try:
        decode(mod, text, make_target({"kind": "llvm", "num-cores": 2}))
    except DecodeError as err:
        assert err.category in codec.CATEGORIES


def test_mutated_scripts_only_raise_decode_error(matmul_mod, cpu_target):
    lines = _valid_script(matmul_mod, cpu_target).split("\n")
    rng = random.Random(1)
    outcomes = set()
    for _ in range(150):
        mutated = list(lines)
        i = rng.randrange(len(mutated))
        op = rng.choice(["drop", "swap", "digit", "dup"])
        if op == "drop":
            del mutated[i]
        elif op == "swap":
            j = rng.randrange(len(mutated))
            mutated[i], mutated[j] = mutated[j], mutated[i]
        elif op == "digit":
            mutated[i] = "".join(str(rng.randrange(10)) if c.isdigit() and rng.random() < 0.5 else c for c in mutated[i])
        else:
            mutated.insert(i, mutated[i])
        try:
            decode(matmul_mod, "\n".join(mutated), cpu_target)
            outcomes.add("ok")
        except DecodeError as err:
            outcomes.add(err.category)
    assert len(outcomes - {"ok"}) >= 3  # several distinct failure categories were exercised


def test_index_maps_are_compact_and_exact():
    """Tensor-core layouts: the IndexMap JSON graph (~2 kB) becomes a short expression, with
    TVM's sharing of subexpressions kept (#k), and expands back byte for byte."""
    from pipeline.tvm_env import tvm

    i0, i1 = tvm.tirx.Var("i0", "int32"), tvm.tirx.Var("i1", "int32")
    v = tvm.tirx.Var("v28", "int32")
    d = tvm.tirx.FloorDiv(i0, tvm.tirx.IntImm("int32", 16))
    im = tvm.tirx.IndexMap([i0, i1], [tvm.tirx.FloorDiv(d, v), tvm.tirx.FloorMod(d, v), i1], None)
    graph = tvm.ir.save_json(im)
    text = codec.compact_index_map(graph)
    assert text == "@i0,i1>((i0//16)//v28),(#1%v28),i1"
    assert codec.expand_index_map(text) == graph
    assert len(text) < len(graph) / 10


def test_decode_error_stage_mapping():
    assert DecodeError("syntax", "x").stage == "decode"
    assert DecodeError("schedule", "x").stage == "apply"
    assert DecodeError("postproc", "x").stage == "postproc"


@pytest.mark.parametrize("key", ["pragma_import_llvm", "pragma_import_c"])
def test_annotations_that_link_code_are_refused(matmul_mod, cpu_target, key):
    """A script cannot attach pragmas that import LLVM IR or C source into the kernel, in the
    short form or the generic one."""
    short = f'B matmul\nA b0 "{key}" "/etc/passwd"'
    generic = 'B matmul\n!Annotate [["b0","\\"x\\""],["' + key + '"],[],null]'
    for text in (short, generic):
        with pytest.raises(codec.DecodeError, match="not one MetaSchedule writes"):
            codec.decode(matmul_mod, text, cpu_target)


@pytest.mark.parametrize("text", ["B matmul\nL b0 999999999", "B matmul\nL b0 3\nS l1 v2-999999999"])
def test_huge_counts_are_refused_before_allocating(matmul_mod, cpu_target, text):
    with pytest.raises(codec.DecodeError) as err:     # before a billion names are made
        codec.decode(matmul_mod, text, cpu_target)
    assert err.value.category == "arity"
