"""End-to-end checks of generated scripts: every failure stage is an outcome."""

import pytest

from pipeline.codec import encode
from pipeline.space import sample_many
from pipeline.verify import Checker, check_in_process


def test_correct_script_passes_numerics_and_is_timed(matmul_mod, cpu_target):
    text = encode(matmul_mod, sample_many(matmul_mod, cpu_target, 1, seed=2)[0].trace, cpu_target)
    outcome = check_in_process(matmul_mod, text, cpu_target, timed=True)
    assert outcome.correct and outcome.latency_s > 0


@pytest.mark.parametrize("text,stage", [
    ("garbage here", "decode"),
    ("B nosuchblock", "apply"),
])
def test_failures_are_classified(matmul_mod, cpu_target, text, stage):
    assert check_in_process(matmul_mod, text, cpu_target).stage == stage


def test_checker_runs_in_a_worker(matmul_mod, cpu_target):
    text = encode(matmul_mod, sample_many(matmul_mod, cpu_target, 1, seed=5)[0].trace, cpu_target)
    checker = Checker(timeout_s=60)
    assert checker.check(matmul_mod, text, {"kind": "llvm", "num-cores": 2}).stage == "ok"
    assert checker.check(matmul_mod, "B matmul\nL b0 3\nT l1 3,3", {"kind": "llvm", "num-cores": 2}).stage == "decode"


def test_a_timeout_or_crash_is_labelled_with_its_phase():
    import os
    import time

    checker = Checker(timeout_s=1)
    try:
        slow = checker.call("build", time.sleep, 5)
        assert slow.stage == "build" and "build timeout" in slow.error
        crash = checker.call("run", os._exit, 3)
        assert crash.stage == "run" and "crashed during run" in crash.error
        assert checker.call("run", max, 1, 2) == 2      # the worker was replaced and works
    finally:
        checker.close()


def test_waiting_for_the_device_is_not_counted_in_the_timeout(matmul_mod, cpu_target):
    """The run phase starts its clock once the device lock is free: a check that waits
    longer than its timeout for another check's run still passes."""
    import threading
    import time

    text = encode(matmul_mod, sample_many(matmul_mod, cpu_target, 1, seed=5)[0].trace, cpu_target)
    checker = Checker(timeout_s=8)
    try:
        checker.check(matmul_mod, text, {"kind": "llvm", "num-cores": 2})   # worker started
        result = {}
        with checker._device:                      # another check is running on the device
            t = threading.Thread(target=lambda: result.update(
                out=checker.check(matmul_mod, text, {"kind": "llvm", "num-cores": 2})))
            t.start()
            time.sleep(10)
        t.join()
        assert result["out"].stage == "ok"
    finally:
        checker.close()


def test_the_chunked_comparison_agrees_with_numpy():
    import numpy as np

    from pipeline.measure import close

    rng = np.random.default_rng(0)
    want = rng.uniform(-1, 1, 1000).astype("float32")
    cases = [want.copy(), want + 1e-4, want + 5e-3, want * 1.0005]
    bad = want.copy()
    bad[999] += 0.1                     # the last chunk's last element
    cases.append(bad)
    for poison in (np.nan, np.inf):
        p = want.copy()
        p[3] = poison
        cases.append(p)
    for got in cases:
        expect = bool(np.isfinite(got).all() and np.allclose(got.astype("float64"), want.astype("float64"),
                                                             rtol=1e-3, atol=2e-3))
        assert close(got, want, 1e-3, 2e-3, chunk=7)[0] == expect
    assert close(bad, want, 1e-3, 2e-3, chunk=7)[1] == pytest.approx(0.1, rel=1e-3)
    half = want.astype("float16")
    assert close(half, want.astype("float16"), 1e-2, 1e-2)[0]
    assert not close(want[:10], want[:11], 1e-3, 2e-3)[0]      # a shape mismatch never passes


def test_a_wrong_output_is_a_numerics_failure_and_not_timed(matmul_mod, cpu_target):
    from pipeline import verify
    from pipeline.measure import build, random_inputs

    executable = build(matmul_mod, cpu_target)
    right = verify._run_and_compare(matmul_mod, executable, cpu_target, random_inputs(matmul_mod, 0), 0, True)
    assert right.correct and right.latency_s > 0 and right.baseline_s > 0
    # other inputs than the reference's: the output differs, so the check stops at numerics
    wrong = verify._run_and_compare(matmul_mod, executable, cpu_target, random_inputs(matmul_mod, 1), 0, True)
    assert wrong.stage == "numerics" and wrong.latency_s is None and "max abs error" in wrong.error


def test_the_per_process_cache_keeps_the_recent_workloads_within_its_bytes():
    import numpy as np

    from pipeline.verify import _Recent

    cache = _Recent(items=2, max_bytes=1000)
    cache.put("a", [np.zeros(50)])           # 400 bytes
    cache.put("b", [np.zeros(50)])
    assert cache.get("a") is not None        # a is now the most recent
    cache.put("c", [np.zeros(50)])           # over 2 items: b, the least recent, goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put("d", [np.zeros(200)])          # 1600 bytes alone: kept, everything older goes
    assert cache.get("d") is not None and cache.get("a") is None and cache.get("c") is None


def test_the_gpu_less_compile_check_rejects_what_the_h200s_nvcc_rejected(cuda_target):
    """rl+cm's four construction scripts of a held-out fp16 conv3d with what the H200 made of
    them (kept from the GPU evaluation's archive of session 16, before the compile check sent
    rl+cm there again: tests/data/h200_nvcc_failures.json): three nvcc failures (TVM's CUDA code
    puts 8 values into a 4-lane make_longlong4), one kernel that ran. The compile check here
    (decode, apply, postprocess, build, nvcc) says the same, before any GPU time."""
    import json
    from pathlib import Path

    from pipeline.verify import Checker
    from pipeline.workloads import Spec, build

    result = json.loads((Path(__file__).resolve().parent / "data" / "h200_nvcc_failures.json").read_text())
    there = result["stages_on_the_h200"]
    assert there == ["build", "build", "build", "ok"]
    assert all("errors detected in the compilation" in e for e in result["errors_on_the_h200"][:3])
    family, shape, dtype = result["spec"]
    mod = build(Spec(family, tuple(shape), dtype))
    checker = Checker(timeout_s=300, workers=2)
    try:
        here = checker.compile_pairs([(mod, s) for s in result["scripts"]], "nvidia/nvidia-h100")
    finally:
        checker.close()
    assert [o.stage for o in here] == there
    assert all("nvcc" in o.error for o in here[:3])


def test_a_kernels_reference_is_timed_once_per_checker(matmul_mod, cpu_target):
    """Scripts of one kernel spread over several workers share the reference's one timing (each
    worker still computes its output to compare against); another kernel gets its own."""
    from pipeline.workloads import Spec, build

    texts = [encode(matmul_mod, s.trace, cpu_target) for s in sample_many(matmul_mod, cpu_target, 4, seed=3)]
    other = build(Spec("matmul", (8, 32, 48), "float32"))
    other_text = encode(other, sample_many(other, cpu_target, 1, seed=1)[0].trace, cpu_target)
    checker = Checker(timeout_s=60, workers=2)
    try:
        outs = checker.check_pairs([(matmul_mod, t) for t in texts] + [(other, other_text)],
                                   {"kind": "llvm", "num-cores": 2}, timed=True)
        workers = len(checker._workers)
    finally:
        checker.close()
    assert all(o.stage == "ok" and o.latency_s > 0 for o in outs) and workers == 2
    assert len({o.baseline_s for o in outs[:4]}) == 1 and outs[0].baseline_s > 0
    assert outs[4].baseline_s > 0 and outs[4].baseline_s != outs[0].baseline_s


def test_inside_alone_no_build_runs_beside_another_check(matmul_mod, cpu_target):
    """Outside `alone()` a batch builds on both workers at once (and beside a run); inside it,
    one build or run at a time (the finalists' re-timing on a CPU, pipeline.bench.tune)."""
    import threading
    import time

    texts = [encode(matmul_mod, s.trace, cpu_target) for s in sample_many(matmul_mod, cpu_target, 4, seed=3)]
    checker = Checker(timeout_s=60, workers=2)
    state = {"active": 0, "mode": "beside", "peak": {}}
    lock = threading.Lock()
    call = checker.call

    def counted(phase, fn, *args, **kw):
        with lock:
            state["active"] += 1
            state["peak"][state["mode"]] = max(state["peak"].get(state["mode"], 0), state["active"])
        try:
            time.sleep(0.2)            # so two calls that can overlap do
            return call(phase, fn, *args, **kw)
        finally:
            with lock:
                state["active"] -= 1

    checker.call = counted
    spec = {"kind": "llvm", "num-cores": 2}
    try:
        beside = checker.check_many(matmul_mod, texts, spec, timed=True)
        with checker.alone():
            state["mode"] = "alone"
            alone = checker.check_many(matmul_mod, texts, spec, timed=True)
        assert not checker._alone          # back to overlapping builds after the block
        with checker.alone_on_cpu(spec) as on_cpu:
            assert on_cpu and checker._alone
        with checker.alone_on_cpu("nvidia/nvidia-h100") as on_gpu:
            assert not on_gpu and not checker._alone     # a GPU's builds stay beside its runs
    finally:
        checker.close()
    assert all(o.stage == "ok" and o.latency_s > 0 for o in beside + alone)
    assert state["peak"] == {"beside": 2, "alone": 1}
