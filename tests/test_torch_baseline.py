"""PyTorch as a baseline: for each supported kernel, the PyTorch call computes the kernel's
own function (checked against the TVM-built kernel on the same random inputs) and is timed."""

import pytest

from pipeline import torch_baseline
from pipeline.measure import build as tvm_build, random_inputs, run


def _reference(mod, target):
    return run(tvm_build(mod, target), target, random_inputs(mod))[-1]


@pytest.mark.parametrize("key", ["GMM:0", "SFM:0", "NRM:0", "C1D:0", "C2D:3", "GRP:2", "DIL:2"])
def test_te_workload_kernels_match_pytorch(key, cpu_target):
    from pipeline.stages.evaluate import te_module

    mod = te_module(key)
    out = torch_baseline.measure(mod, key, None, _reference(mod, cpu_target), "cpu")
    assert out["error"] is None and out["latency_s"] > 0, out


@pytest.mark.parametrize("family,shape", [
    ("matmul", (32, 48, 64)), ("dense", (32, 48, 64)), ("batch_matmul", (2, 16, 24, 32, 1)),
    ("batch_matmul", (2, 16, 24, 32, 0)), ("softmax", (16, 100)), ("layer_norm", (16, 64, 0)),
    ("layer_norm", (16, 64, 1)), ("conv2d", (1, 14, 16, 32, 3, 2, 1, 1, 2)),
])
def test_catalog_families_match_pytorch(family, shape, cpu_target):
    from pipeline.workloads import Spec, build

    spec = Spec(family, shape, "float32")
    mod = build(spec)
    out = torch_baseline.measure(mod, spec.id, spec.to_json(), _reference(mod, cpu_target), "cpu")
    assert out["error"] is None and out["latency_s"] > 0, out


def test_a_wrong_mapping_is_caught_not_timed(cpu_target):
    from pipeline.workloads import Spec, build

    spec = Spec("matmul", (8, 8, 8), "float32")
    mod = build(spec)
    wrong = {**spec.to_json(), "family": "dense"}          # x @ w.T instead of a @ b
    out = torch_baseline.measure(mod, spec.id, wrong, _reference(mod, cpu_target), "cpu")
    assert out["latency_s"] is None and "differs" in out["error"]
    assert torch_baseline.for_kernel("T2D:0") is None


def test_evaluation_reports_the_model_against_pytorch(cpu_target):
    """evaluate's `vs_pytorch`: PyTorch's latency per timed kernel it supports, the model's
    best construction latency over it; kernels without a PyTorch call are left out."""
    from pipeline.stages.evaluate import Task, te_module, vs_pytorch
    from pipeline.verify import Outcome

    tasks = [Task("GMM:0", "te_workload", te_module("GMM:0")), Task("T2D:0", "te_workload", te_module("T2D:0")),
             Task("SFM:0", "te_workload", te_module("SFM:0"), timed=False)]
    res = {"GMM:0": {"construction": [Outcome("run", "x"), Outcome("ok", latency_s=2e-3)]},
           "T2D:0": {"construction": [Outcome("ok", latency_s=1e-3)]}, "SFM:0": {"construction": []}}
    out = vs_pytorch(tasks, res, {}, cpu_target, seed=0)
    assert out["device"] == "cpu" and out["tasks"] == 1
    row = out["per_task"][0]
    assert row["task"] == "GMM:0" and row["pytorch_s"] > 0 and row["model_s"] == 2e-3
    assert abs(out["latency_ratio"] - 2e-3 / row["pytorch_s"]) < 1e-12
