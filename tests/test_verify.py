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
