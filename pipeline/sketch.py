"""Walk a MetaSchedule design-space sketch one sampling decision at a time.

A kernel's design space (post-order-apply) is a few sketches: traces whose instruction
sequence is fixed and whose only freedom is the decision of each sampling instruction
(ANCHORS.md: 191/192 CPU and 254/256 CUDA search records are a sketch replayed with their
decisions, then simplified). So a script of that space is fully given by (sketch, decisions),
and at any point the valid next decision is a finite, computable set:

- SamplePerfectTile: the ordered factorizations of the loop's extent *in the schedule as it
  stands* (it depends on earlier decisions after fusion or compute-at) into n factors, the
  innermost at most `max_innermost_factor`;
- SampleCategorical: the indices of its candidates;
- SampleComputeLocation: the locations TVM itself accepts (probed on a copy of the schedule,
  since TVM silently replaces a decision it does not accept);
- on CUDA, tile factors that end up bound to threads are limited so that the block's thread
  count can still land in [thread_extent_low, thread_extent_high] and vthreads stay within the
  target's limit (VerifyGPUCode would reject the rest after the whole script is written).

`Walk` replays a (simplified) sketch on a fresh schedule in a helper thread, through TVM's
own `Trace.apply_to_schedule(decision_provider=...)`, and pauses at each sampling instruction
until `decide()` gives its decision: one pass over the trace per script, whatever the number
of decisions. The text side (what each decision looks like in the script language, and which
tokens may come next) is pipeline.guided.
"""

from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass

from pipeline.space import design_spaces
from pipeline.tvm_env import TVM_ERRORS, Schedule, Trace, tvm

SAMPLING = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation")
_THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


def sketches(mod, target) -> list[Trace]:
    """The design space's sketches in the form the script language writes (simplified, no
    postprocessing): the templates of every script the guided decoder can produce."""
    return [t.simplified(remove_postproc=True) for t in design_spaces(mod, target)]


# ---------------------------------------------------------------------------------------
# Domains
# ---------------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def factorizations(extent: int, n: int, max_innermost: int, limit: int = 200_000) -> list[tuple[int, ...]]:
    """Ordered n-tuples of positive integers whose product is `extent`, the last at most
    `max_innermost` (no bound when it is <= 0), as MetaSchedule's SamplePerfectTile draws them."""
    out: list[tuple[int, ...]] = []

    def rec(rest: int, k: int, prefix: tuple[int, ...]):
        if len(out) >= limit:
            return
        if k == 1:
            if max_innermost <= 0 or rest <= max_innermost:
                out.append(prefix + (rest,))
            return
        for d in _divisors(rest):
            rec(rest // d, k - 1, prefix + (d,))

    rec(max(1, extent), n, ())
    return out


@dataclass
class ThreadBudget:
    """What VerifyGPUCode will check of thread extents, tracked while tiles are chosen."""
    low: int = 1
    high: int = 1024
    max_vthread: int = 8
    threads: int = 1               # product of the factors bound to threadIdx so far
    vthreads: int = 1


@dataclass
class Choice:
    """A sampling instruction waiting for its decision. `values` are the decisions allowed."""
    index: int          # the instruction's position in the sketch
    kind: str
    values: list        # decisions: a tuple of factors, or an int


class WalkFailed(RuntimeError):
    """The sketch did not apply with the decisions given (TVM's message)."""


_DONE = object()

# How long the caller waits for TVM to reach the next sampling instruction (replaying the
# instructions in between and computing the domain). A TVM hang costs only this walk: it
# fails, the helper thread is left behind (a thread cannot be killed; it is a daemon).
STEP_TIMEOUT_S = 60.0


class Walk:
    """Replays one sketch on `mod`, pausing at each sampling instruction.

        walk = Walk(mod, target, sketch)
        c = walk.next()            # a Choice, or None when the sketch is complete
        walk.decide(value)         # then next() again
    """

    def __init__(self, mod, target, sketch: Trace, thread_roles: dict | None = None):
        self.mod, self.target, self.sketch = mod, target, sketch
        self.roles = thread_roles if thread_roles is not None else thread_roles_of(sketch)
        self.sch = Schedule(mod, debug_mask=0)
        self._to_main: queue.Queue = queue.Queue()
        self._to_walker: queue.Queue = queue.Queue()
        self._budget = _budget(target, sketch)
        self._extent_of: dict = {}      # sketch loop RV -> extent (CUDA: to plan thread counts ahead)
        self._smem = None                # CUDA: the shared-memory model of the sketch, built at its first tile
        self._inner: dict[int, int] = {}  # tile instruction -> product of its factors inside the block
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = False
        self.finished = False

    # -- the helper thread ------------------------------------------------------------
    def _run(self):
        position = [0]
        insts = list(self.sketch.insts)

        def provider(inst, inputs, attrs, decision):
            i = position[0]
            position[0] += 1
            kind = inst.kind.name
            if kind == "GetLoops" and self._budget is not None:
                # GetLoops is pure: ask for the same loops to learn the extents later tiles will split
                for rv, loop in zip(inst.outputs, self.sch.get_loops(inputs[0])):
                    ext = self.sch.get(loop).extent
                    if isinstance(ext, tvm.tirx.IntImm):
                        self._extent_of[rv] = int(ext.value)
            if kind not in SAMPLING:
                return decision
            values = self._domain(i, kind, inputs, attrs)
            self._to_main.put(Choice(i, kind, values))
            answer = self._to_walker.get()
            if answer is _DONE:
                raise WalkFailed("abandoned")
            return answer

        try:
            Trace(insts, dict(self.sketch.decisions)).apply_to_schedule(self.sch, remove_postproc=True, decision_provider=provider)
            self._to_main.put(None)
        except (WalkFailed, *TVM_ERRORS) as err:
            self._to_main.put(WalkFailed(_first_line(err)))

    # -- the caller's side ------------------------------------------------------------
    def next(self) -> Choice | None:
        if not self._started:
            self._started = True
            self._thread.start()
        try:
            item = self._to_main.get(timeout=STEP_TIMEOUT_S)
        except queue.Empty:
            self.finished = True
            raise WalkFailed(f"TVM did not reach the next decision within {STEP_TIMEOUT_S:.0f} s") from None
        if isinstance(item, WalkFailed):
            self.finished = True
            raise item
        if item is None:
            self.finished = True
            self._thread.join()
        self._pending = item
        return item

    def decide(self, value) -> None:
        c = self._pending
        if c.kind == "SamplePerfectTile":
            self._spend(c.index, value)
        self._to_walker.put(list(value) if isinstance(value, tuple) else value)

    def close(self) -> None:
        """Stop a walk that will not be finished (its thread unwinds)."""
        if self._started and not self.finished:
            self._to_walker.put(_DONE)
            self.finished = True

    # -- domains ----------------------------------------------------------------------
    def _domain(self, i: int, kind: str, inputs, attrs) -> list:
        if kind == "SampleCategorical":
            return list(range(len(attrs[0])))
        if kind == "SamplePerfectTile":
            extent = self.sch.get(inputs[0]).extent
            if not isinstance(extent, tvm.tirx.IntImm):
                raise WalkFailed(f"loop extent {extent} is not a constant")
            values = factorizations(int(extent.value), int(attrs[0]), int(attrs[1]))
            # both limits if they can be met together; else the shared-memory one, which an
            # earlier tile cannot make up for later
            return self._fit_shared(i, self._fit_threads(i, values)) or self._fit_shared(i, values) or values
        # SampleComputeLocation: TVM replaces a decision it does not accept; keep those it keeps
        # (-2 inline, -1 root, then loop indices; probed until 8 indices in a row are refused).
        out, misses, d = [], 0, -2
        while misses < 8:
            probe = self.sch.copy()
            try:
                loop = probe.sample_compute_location(inputs[0], decision=d)
                kept = int(probe.trace.get_decision(probe.trace.insts[-1])) == d
                if kept and d >= 0:
                    # the sketch computes the block there next; a loop whose extent depends on an
                    # outer loop would be refused by DisallowDynamicLoop once the script is done
                    probe.compute_at(inputs[0], loop, preserve_unit_loops=True)
                    kept = all(isinstance(probe.get(lp).extent, tvm.tirx.IntImm)
                               for lp in probe.get_loops(inputs[0]))
            except TVM_ERRORS:
                kept = False
            if kept:
                out.append(d)
            misses = 0 if kept or d < 0 else misses + 1
            d += 1
        return out

    # CUDA: thread and vthread extents (VerifyGPUCode's limits) folded into the tile domains.
    def _fit_threads(self, i: int, values: list[tuple]) -> list[tuple]:
        """Keep the tiles whose thread factors keep the block within max threads and vthreads,
        and from which the block can still reach its minimum thread count: the tiles still to
        come can add at most their loops' extents (GetLoops told us those)."""
        roles = self.roles.get(i)
        if not roles or self._budget is None:
            return values
        b = self._budget
        insts = self.sketch.insts
        room = 1
        for j, r in self.roles.items():
            if j > i and "thread" in r.values():
                room *= self._extent_of.get(insts[j].inputs[0], b.high)
        kept = []
        for v in values:
            t = b.threads * math.prod(v[k] for k, role in roles.items() if role == "thread")
            vt = b.vthreads * math.prod(v[k] for k, role in roles.items() if role == "vthread")
            if t <= b.high and vt <= b.max_vthread and t * room >= b.low:
                kept.append(v)
        return kept

    # CUDA: shared memory (VerifyGPUCode's max_shared_memory_per_block) folded into the tiles.
    def _fit_shared(self, i: int, values: list[tuple]) -> list[tuple]:
        """Keep the tiles with which the shared-memory tiles of the block still fit, the tiles
        still to come counted at their smallest (extent 1 inside the block)."""
        if self._budget is None or not values:
            return values
        if self._smem is None:
            self._smem = _SharedModel(self.sketch, self.sch)
        m = self._smem
        if i not in m.var_of or not m.buffers:
            return values
        return [v for v in values if m.bytes({**self._inner, i: math.prod(v[1:])}) <= m.limit(self.target)]

    def _spend(self, i: int, value: tuple) -> None:
        self._inner[i] = math.prod(value[1:])
        roles = self.roles.get(i)
        if not roles or self._budget is None:
            return
        for k, role in roles.items():
            if role == "thread":
                self._budget.threads *= value[k]
            elif role == "vthread":
                self._budget.vthreads *= value[k]


class _SharedModel:
    """Shared memory of a GPU multi-level-tiling sketch as a function of its tiles.

    The sketch caches reads of the compute block in shared memory (CacheRead "shared") and
    computes them at the outermost reduction tile; a thread block then holds, per iterator,
    the iterations of every tile level but the outermost (blockIdx / outer reduction loop).
    For a read `A[h*2 + rh, ...]` of the block, the footprint along that axis is the number of
    values its index takes, bounded for any alignment of the tile (_span: 2*(h-1) + rh). Bytes = sum over cached buffers of the product
    of their footprints times the element size, times the pipeline's versions (MetaSchedule's sketches for dense, conv and
    matmul kernels; a read that is not affine leaves the model out)."""

    def __init__(self, sketch: Trace, sch: Schedule):
        insts = list(sketch.insts)
        name_of = {inst.outputs[0]: str(inst.attrs[0]) for inst in insts if inst.kind.name == "GetSBlock"}
        loops_of = {}   # loop RV -> (block RV, position)
        for inst in insts:
            if inst.kind.name == "GetLoops":
                for k, rv in enumerate(inst.outputs):
                    loops_of[rv] = (inst.inputs[0], k)
        self.var_of: dict[int, tuple] = {}   # tile inst -> (block RV, iterator position)
        for i, inst in enumerate(insts):
            if inst.kind.name == "SamplePerfectTile" and inst.inputs[0] in loops_of:
                self.var_of[i] = loops_of[inst.inputs[0]]
        self.buffers = []   # (block RV, [(coefficients per iterator, extent)] per axis, bytes per element)
        # A software-pipelined sketch keeps one copy of each shared tile per pipeline stage
        # (InjectSoftwarePipeline): stages [0, 0, 3] -> 4 versions.
        self.versions = 1
        for inst in insts:
            if inst.kind.name == "Annotate" and str(inst.attrs[0]) == "software_pipeline_stage":
                try:
                    self.versions = max(self.versions, 1 + max(int(x) for x in inst.inputs[1]))
                except (TypeError, ValueError):
                    self.versions = max(self.versions, 4)
        for inst in insts:
            if inst.kind.name == "CacheRead" and str(inst.attrs[1]) == "shared" and inst.inputs[0] in name_of:
                try:
                    block = sch.get(sch.get_sblock(name_of[inst.inputs[0]]))
                    region = block.reads[int(inst.attrs[0])]
                    ivars = [iv.var for iv in block.iter_vars]
                    axes = []
                    for r in region.region:
                        if not isinstance(r.extent, tvm.tirx.IntImm):
                            raise ValueError("dynamic region")
                        axes.append((_span_tree(r.min, ivars), int(r.extent)))
                    self.buffers.append((inst.inputs[0], axes, _itemsize(str(region.source.ty.dtype))))
                except (ValueError, *TVM_ERRORS):
                    self.buffers = []
                    return

    def bytes(self, inner: dict[int, int]) -> int:
        """`inner`: tile inst -> its extent inside the thread block (undecided tiles count 1)."""
        ext: dict[tuple, int] = {self.var_of[i]: e for i, e in inner.items() if i in self.var_of}
        total = 0
        for block, axes, size in self.buffers:
            n = size
            for tree, extent in axes:
                n *= _span(tree, lambda k: ext.get((block, k), 1)) + extent - 1
            total += n
        return total * self.versions

    @staticmethod
    def limit(target) -> int:
        return int(target.attrs.get("max_shared_memory_per_block", 49152))


def _span_tree(expr, ivars):
    """An index expression as a small tree _span can evaluate; ValueError if it has other ops."""
    kind = type(expr).__name__
    if kind == "Var":
        for k, v in enumerate(ivars):
            if v.same_as(expr):
                return ("var", k)
        raise ValueError(f"free variable {expr}")
    if kind == "IntImm":
        return ("const",)
    if kind in ("Add", "Sub"):
        return ("add", _span_tree(expr.a, ivars), _span_tree(expr.b, ivars))
    if kind in ("Mul", "FloorDiv", "FloorMod"):
        for a, b in ((expr.a, expr.b), (expr.b, expr.a) if kind == "Mul" else (None, None)):
            if b is not None and type(b).__name__ == "IntImm":
                return (kind.lower(), _span_tree(a, ivars), abs(int(b.value)))
    raise ValueError(f"index operation {kind} is not modelled")


def _span(tree, extent_of) -> int:
    """Upper bound on the number of distinct values of an index expression when iterator k
    takes extent_of(k) consecutive values, whatever the alignment."""
    op = tree[0]
    if op == "var":
        return extent_of(tree[1])
    if op == "const":
        return 1
    if op == "add":
        return _span(tree[1], extent_of) + _span(tree[2], extent_of) - 1
    n = _span(tree[1], extent_of)
    if op == "mul":
        return (n - 1) * tree[2] + 1
    if op == "floordiv":
        # tiles are aligned to their extent, which divides the loop's: no straddling when one
        # of the two divides the other
        c = max(1, tree[2])
        if c % n == 0 or n % c == 0:
            return max(1, n // c)
        return -(-(n - 1) // c) + 1
    return min(n, tree[2])          # floormod


def _itemsize(dtype: str) -> int:
    """Bytes per element of a TVM dtype string (float16 -> 2, int8 -> 1, bool -> 1)."""
    bits = "".join(ch for ch in dtype.split("x")[0] if ch.isdigit())
    return max(1, int(bits) // 8) if bits else 1


def _budget(target, sketch: Trace) -> ThreadBudget | None:
    """VerifyGPUCode's thread limits for this sketch: the target's threads per block, and the
    bounds MetaSchedule's rules annotate on the block (thread_extent_{low,high}_inclusive)."""
    if target.kind.name != "cuda":
        return None
    b = ThreadBudget(high=int(target.attrs.get("max_threads_per_block", 1024)), max_vthread=8)
    for inst in sketch.insts:
        if inst.kind.name == "Annotate" and len(inst.inputs) > 1:
            key, value = str(inst.attrs[0]), inst.inputs[1]
            if key == "meta_schedule.thread_extent_low_inclusive":
                b.low = max(b.low, int(value))
            elif key == "meta_schedule.thread_extent_high_inclusive":
                b.high = min(b.high, int(value))
    return b


def thread_roles_of(sketch: Trace) -> dict[int, dict[int, str]]:
    """For each SamplePerfectTile of the sketch: which of its factors end up as a loop bound to
    threadIdx.* or vthread.* (through Split, then Fuse, then Bind). Pure dataflow over the
    sketch's random variables; the factors' values do not matter."""
    origin: dict[object, list[tuple[int, int]]] = {}   # loop RV -> [(tile inst, factor index)]
    factor_of: dict[object, tuple[int, int]] = {}      # sampled value RV -> (tile inst, index)
    roles: dict[int, dict[int, str]] = {}
    for i, inst in enumerate(sketch.insts):
        kind = inst.kind.name
        if kind == "SamplePerfectTile":
            for k, out in enumerate(inst.outputs):
                factor_of[out] = (i, k)
        elif kind == "Split":
            for out, f in zip(inst.outputs, list(inst.inputs)[1:]):
                if f is not None and f in factor_of:
                    origin[out] = [factor_of[f]]
        elif kind == "Fuse":
            merged = [o for loop in inst.inputs for o in origin.get(loop, [])]
            origin[inst.outputs[0]] = merged
        elif kind == "Bind":
            axis = str(inst.attrs[0])
            role = "thread" if axis in _THREAD_AXES else "vthread" if axis.startswith("vthread") else None
            if role:
                for t, k in origin.get(inst.inputs[0], []):
                    roles.setdefault(t, {})[k] = role
    return roles


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(err).__name__)[:300]
