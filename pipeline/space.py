"""MetaSchedule design spaces: generate them, sample scripts from them, run postprocessing.

Used by the codec (which re-derives the postprocessing section of a trace), the guided
decoder (pipeline.sketch: the sketches), the corpus stage (random scripts from the design
space, as TLM does), the codec report and the evaluation (sampled refinement sources).
Everything here runs on the CPU, for CUDA targets too: only building for real and timing
need a GPU.
"""

from __future__ import annotations

from pipeline.tvm_env import TVM_ERRORS, Schedule, Trace, last_line, ms, target_key, te, tvm


_CONTEXTS: dict[str, "ms.TuneContext"] = {}


def variant(target: "tvm.target.Target") -> str | None:
    """How the project's design space for `target` differs from MetaSchedule's default
    (None: it does not). Anything made from the space (corpus shards) names it."""
    return "no-tensor-core" if target.kind.name == "cuda" else None


def generator(target: "tvm.target.Target"):
    """The design space every stage uses: MetaSchedule's post-order-apply with the target's
    default rules, except that CUDA leaves out the tensor-core rule. Why: on apache-tvm
    0.27.0.post1, the wmma sketches of fp16-in / fp32-accumulate kernels (all of the
    catalog's fp16 kernels) fail in lowering (`tvm_access_ptr element type must match the
    source buffer`, after dynamic shared memory is merged): 114 of 128 candidates of the first
    H200 search shard, 5 of 6 samples here; with fp16 accumulation they build, which the
    catalog's numerics rule out. Without the rule those kernels get CUDA-core sketches
    that build (reports/LOG.md, session 4)."""
    if variant(target) == "no-tensor-core":
        return ms.space_generator.PostOrderApply(sch_rules="cuda", postprocs="cuda", mutator_probs="cuda")
    return "post-order-apply"


def context(target: "tvm.target.Target", mod: "tvm.IRModule | None" = None) -> "ms.TuneContext":
    """A TuneContext for `target` with the project's space generator (`generator`)."""
    key = target_key(target)
    if mod is not None:
        return ms.TuneContext(mod=mod, target=target, space_generator=generator(target),
                              search_strategy="replay-trace", task_name="main", num_threads=1)
    if key not in _CONTEXTS:
        a = te.placeholder((4,), name="a")
        b = te.compute((4,), lambda i: a[i] + 1.0, name="b")
        dummy = tvm.IRModule({"main": te.create_prim_func([a, b])})
        _CONTEXTS[key] = ms.TuneContext(mod=dummy, target=target, space_generator=generator(target),
                                        search_strategy="replay-trace", task_name="main", num_threads=1)
    return _CONTEXTS[key]


def postprocs(target: "tvm.target.Target") -> list:
    """The target's default MetaSchedule postprocessors, initialised for it."""
    return list(context(target).space_generator.postprocs)


class SpaceError(RuntimeError):
    """MetaSchedule could not generate a design space for a workload on a target."""


def design_spaces(mod: "tvm.IRModule", target: "tvm.target.Target") -> list[Trace]:
    """The sketches (traces with sampled decisions) of the design space."""
    try:
        return [sch.trace for sch in context(target, mod).generate_design_space()]
    except TVM_ERRORS as err:
        # Seen with TVM 0.27: attention_score on CUDA raises IndexError inside a schedule rule.
        raise SpaceError(f"no design space on {target.kind.name}: {last_line(err) or type(err).__name__}") from None


def apply_postprocs(sch: Schedule, target: "tvm.target.Target") -> bool:
    """Enter postprocessing and run every postprocessor; False if one rejects the schedule."""
    sch.enter_postproc()
    return all(p.apply(sch) for p in postprocs(target))


def sample(mod: "tvm.IRModule", target: "tvm.target.Target", sketch: Trace, seed: int) -> Schedule | None:
    """Replay a sketch with fresh random decisions, then postprocess (as MetaSchedule's
    ReplayTrace strategy does). None when sampling or a postprocessor rejects it."""
    sch = Schedule(mod, seed=seed, debug_mask=0)
    try:
        Trace(sketch.insts, {}).apply_to_schedule(sch, remove_postproc=True)
    except TVM_ERRORS:
        return None
    return sch if apply_postprocs(sch, target) else None


def sample_many(mod, target, n: int, seed: int = 0, max_tries: int | None = None) -> list[Schedule]:
    """Up to `n` postprocessed random schedules drawn round-robin from the design spaces."""
    sketches = design_spaces(mod, target)
    out: list[Schedule] = []
    tries = 0
    limit = max_tries if max_tries is not None else 4 * n + 8
    while len(out) < n and tries < limit and sketches:
        sch = sample(mod, target, sketches[tries % len(sketches)], 1 + (seed * 100003 + tries) % 2147483646)
        tries += 1
        if sch is not None:
            out.append(sch)
    return out
