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
