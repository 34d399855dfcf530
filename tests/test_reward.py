"""The shaped RL reward on real TVM builds: every failure stage, a correct faster script,
the measurement cache, and a script that runs too long being cut off by the timeout."""

import math

import pytest

from pipeline.codec import encode
from pipeline.prompts import source_script
from pipeline.reward import Measurer, RewardParams, ShapedReward, score
from pipeline.space import sample_many
from pipeline.verify import Outcome
from pipeline.workloads import Spec, build

CPU = {"kind": "llvm", "num-cores": 2}
RP = RewardParams()


def test_penalties_are_graded_and_correct_kernels_always_win():
    order = ["decode", "apply", "postproc", "build", "run", "numerics"]
    pens = [score(Outcome(s, "x"), None, RP).total for s in order]
    assert pens == sorted(pens) and len(set(pens)) == len(pens)
    # partial credit for a long valid prefix never reaches an apply failure
    assert score(Outcome("decode", "x", line=500), None, RP).total < score(Outcome("apply", "x"), None, RP).total
    assert score(Outcome("decode", "x", line=10), None, RP).total > score(Outcome("decode", "x", line=1), None, RP).total
    slow = score(Outcome("ok", None, latency_s=100.0, baseline_s=1.0), None, RP)
    fast = score(Outcome("ok", None, latency_s=0.5, baseline_s=1.0), None, RP)
    assert slow.total > max(pens) and fast.total > slow.total
    assert fast.speed == pytest.approx(RP.speed_weight * math.log2(2.0))
    src = Outcome("ok", None, latency_s=1.0, baseline_s=1.0)
    refined = score(Outcome("ok", None, latency_s=0.25, baseline_s=1.0), src, RP)
    assert refined.speedup_vs_source == pytest.approx(4.0) and refined.speed > fast.speed


def test_bad_reward_params_are_refused():
    from pipeline.params import ParamsError

    with pytest.raises(ParamsError):
        RewardParams(penalties={**RP.penalties, "build": -0.9})
    with pytest.raises(ParamsError):
        RewardParams(decode_progress=0.5)


def test_refinement_prompt_gives_its_source_script():
    prompt = "target: llvm\nargs: x\n### current script (1.50x baseline)\nB a\nB b\n### faster script\n"
    assert source_script(prompt) == "B a\nB b"
    assert source_script("target: llvm\nargs: x\n### script\n") is None


def test_reward_on_real_completions_of_every_cpu_stage(cpu_target):
    spec = Spec("matmul", (16, 64, 64), "float32")
    mod = build(spec)
    good = [encode(mod, s.trace, cpu_target) for s in sample_many(mod, cpu_target, 2, seed=2)]
    lines = good[0].split("\n")
    bad_build = "\n".join(lines[:11] + ["BI l9 tx"] + lines[11:])   # a thread binding LLVM cannot build
    completions = ["garbage here", "B nosuchblock", bad_build, good[0], good[1]]
    reward = ShapedReward(Measurer({spec.id: spec.to_json()}, CPU, timeout_s=60, workers=2), RP)
    correctness, speed = reward.functions()
    prompts = ["target: llvm\n### script\n"] * 4 + [f"target: llvm\n### current script (1.00x baseline)\n{good[0]}\n### faster script\n"]
    workloads = [spec.id] * 5
    c = correctness(prompts=prompts, completions=completions, workload=workloads)
    s = speed(prompts=prompts, completions=completions, workload=workloads)
    stages = [e["stage"] for e in reward.log]
    assert stages == ["decode", "apply", "build", "ok", "ok"]
    assert c[:3] == [RP.penalties["decode"], RP.penalties["apply"], RP.penalties["build"]]
    assert c[3] == c[4] == 0.0 and s[:3] == [0.0, 0.0, 0.0]
    # the speed bonus is the measured speedup over the unscheduled build, timed the same way
    o = reward.measurer.cache[(spec.id, good[0])]
    assert o.latency_s > 0 and o.baseline_s > 0
    assert s[3] == pytest.approx(max(-RP.bonus_floor, min(RP.bonus_cap, RP.speed_weight * math.log2(o.speedup))))
    assert reward.log[4]["speedup_vs_source"] is not None
    builds = reward.measurer.builds
    speed(prompts=prompts, completions=completions, workload=workloads)
    assert reward.measurer.builds == builds == 5   # each (workload, script) measured once


def test_postproc_and_run_stages_on_the_cuda_target(cuda_target):
    from pipeline.measure import device_available
    from pipeline.verify import check_in_process

    if device_available(cuda_target):
        pytest.skip("a CUDA device is present: the run stage would succeed")
    mod = build(Spec("matmul", (64, 64, 64), "float32"))
    text = encode(mod, sample_many(mod, cuda_target, 1, seed=3)[0].trace, cuda_target)
    assert check_in_process(mod, text, cuda_target).stage == "run"   # no device to run on here
    lines = text.split("\n")
    i = next(k for k, ln in enumerate(lines) if ln.startswith("T l2 "))
    j = next(k for k, ln in enumerate(lines) if ln.startswith("T l3 "))
    lines[i], lines[j] = "T l2 1,1,32,2,1", "T l3 1,1,64,1,1"   # 32 x 64 = 2048 threads per block
    out = check_in_process(mod, "\n".join(lines), cuda_target)
    assert out.stage == "postproc", out


def test_a_script_that_runs_too_long_costs_only_its_own_reward(cpu_target):
    big = Spec("matmul", (1024, 1024, 1024), "float32")
    small = Spec("matmul", (16, 64, 64), "float32")
    specs = {big.id: big.to_json(), small.id: small.to_json()}
    big_mod, mod = build(big), build(small)
    # a 1024^3 matmul: its reference (unscheduled) build alone runs for seconds per call
    slow = encode(big_mod, sample_many(big_mod, cpu_target, 1, seed=2)[0].trace, cpu_target)
    ok = encode(mod, sample_many(mod, cpu_target, 1, seed=2)[0].trace, cpu_target)
    measurer = Measurer(specs, CPU, timeout_s=3, workers=1)
    out_slow, out_ok = measurer.measure([(big.id, slow), (small.id, ok)])
    assert out_slow.stage == "run" and "timeout" in out_slow.error
    assert out_ok.stage == "ok"    # the worker was replaced; the next script is measured normally
