"""Evaluation metrics and gates on known outcomes; `little-dragon optimize` on real kernels."""

import json

import time

import pytest

from helpers import SPEC, tiny_model

from pipeline.stages import evaluate
from pipeline.cli import main
from pipeline.verify import Outcome


def ok(lat, base=1.0):
    return Outcome("ok", None, lat, base)


def _tasks():
    a = evaluate.Task("a", "test", None, ms_outcomes=[ok(0.5), ok(0.25), ok(0.2)], ms_seconds=30.0)
    b = evaluate.Task("b", "te_workload", None, ms_outcomes=[ok(0.5), Outcome("build", "x")], ms_seconds=10.0)
    return [a, b]


def test_metrics_correctness_speedup_ratio_and_time_to_schedule():
    tasks = _tasks()
    res = {"a": {"construction": [ok(0.5), Outcome("decode", "x")], "seconds": 2.0, "scripts": [],
                 "refinement": [{"source": ok(0.5), "attempts": [ok(0.25), Outcome("apply", "x")]}]},
           "b": {"construction": [Outcome("decode", "x"), Outcome("run", "x")], "seconds": 3.0, "scripts": [],
                 "refinement": []}}
    m = evaluate.model_metrics(res, tasks, K=2)
    assert m["construction"]["correctness"] == 0.25
    assert m["construction"]["failures_by_stage"]["decode"] == 2 and m["construction"]["failures_by_stage"]["run"] == 1
    # a: 2x; b has no correct script: counted apart, never as a 1x speedup
    assert m["construction"]["speedup_geomean"] == pytest.approx(2.0)
    assert m["construction"]["timed_tasks_without_correct_script"] == 1
    assert m["construction"]["kernels_below_098"] == ["a", "b"]
    assert m["refinement"]["correctness"] == 0.5 and m["refinement"]["speedup_vs_source_geomean"] == pytest.approx(2.0)
    # a: 0.5 / best of MS's first 2 (0.25) = 2; b: baseline 1.0 / 0.5 = 2
    assert m["vs_metaschedule"]["latency_ratio"] == pytest.approx(2.0)
    assert m["vs_metaschedule"]["latency_ratio_full_budget"] == pytest.approx((2.5 * 2.0) ** 0.5)
    tts = {x["task"]: x for x in m["time_to_schedule"]["per_task"]}
    assert tts["a"]["metaschedule_seconds_to_same_latency"] == pytest.approx(10.0)  # reached at trial 1 of 3
    assert tts["b"]["model_correct"] is False
    gate = evaluate.gate(m, evaluate.DEFAULT_GATES)
    assert not gate["passed"] and any("construction correctness" in r for r in gate["reasons"])
    assert any("latency ratio" in r for r in gate["reasons"])


def test_untimed_kernels_count_for_correctness_only():
    t = evaluate.Task("c", "te_workload", None, timed=False)
    res = {"c": {"construction": [Outcome("ok"), Outcome("ok")], "seconds": 1.0, "scripts": [],
                 "refinement": [{"source": Outcome("ok"), "attempts": [Outcome("ok"), Outcome("numerics", "x")]}]}}
    m = evaluate.model_metrics(res, [t], K=2)
    assert m["construction"]["correctness"] == 1.0 and m["construction"]["speedup_geomean"] is None
    assert m["refinement"]["correctness"] == 0.5 and m["construction"]["timed_tasks"] == 0
    assert m["per_task"][0]["timed"] is False and m["construction"]["kernels_below_098"] == []


def test_incomplete_guided_scripts_are_failures():
    outs = evaluate._incomplete_fail([Outcome("ok"), Outcome("ok"), Outcome("ok")], [True, False, None])
    assert [o.stage for o in outs] == ["ok", "decode", "ok"] and "incomplete" in outs[1].error


def test_tasks_are_batched_by_rows_in_order():
    """Whole tasks fill a generation batch of `rows` (prompts x attempts), in order; a task too
    big for one batch still gets one of its own."""
    def task(key, refinements):
        return evaluate.Task(key, "catalog", None, refinements=[("q", "s")] * refinements)

    tasks = [task("a", 2), task("b", 0), task("c", 1), task("d", 5), task("e", 0)]
    chunks = evaluate._task_chunks(tasks, attempts=4, rows=16)     # rows: 12, 4, 8, 24, 4
    assert [[t.key for t in c] for c in chunks] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert [t.key for c in chunks for t in c] == [t.key for t in tasks]


def test_a_batch_expected_to_end_past_the_stop_is_cut_to_what_fits(tmp_path, monkeypatch):
    """With a deadline, a model writes only the tasks whose batch is expected to end before it (at
    the seconds a row of its kept results, then of its last batch), so a step's stop falls between
    two batches; with no estimate the whole batch goes while time is left; none past the deadline."""
    from types import SimpleNamespace

    from pipeline import models
    from pipeline.generate import GenerationParams

    kept = {"result": {"generation_seconds": 30.0, "check_seconds": 8.0, "rank_seconds": 2.0,
                       "refinement": [{}, {}], "construction": []}}
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "x.json").write_text(json.dumps({"model:rl:guided:with-refinements": kept,
                                                            "model:sft:guided:with-refinements": {"result": {}}}))
    p = SimpleNamespace(archive_dir=str(tmp_path))
    assert evaluate.kept_rate(p, "rl", "guided", attempts=4) == 40.0 / 12     # 3 prompts x 4 attempts
    assert evaluate.kept_rate(p, "sft", "guided", 4) is None and evaluate.kept_rate(None, "rl", "guided", 4) is None

    tasks = [evaluate.Task(k, "catalog", None, timed=False) for k in "abcde"]    # 4 rows each
    assert [t.key for t in evaluate._fitting(tasks, 4, rate=10.0, left=100.0)] == ["a", "b"]   # 8 x 10 x 1.25
    assert evaluate._fitting(tasks, 4, rate=None, left=1.0) == tasks and evaluate._fitting(tasks, 4, 10.0, 0.0) == []

    batches = []

    def write(model, tok, chunk, *args):
        batches.append([t.key for t in chunk])
        return {t.key: t.key for t in chunk}

    monkeypatch.setattr(evaluate, "_write_and_check", write)
    monkeypatch.setattr(models, "load", lambda d: (None, None))
    monkeypatch.setitem(evaluate._RATES, ("rl", "guided"), 10.0)
    g = GenerationParams(attempts=4, batch_rows=64)
    out = evaluate.run_model("rl", "m", tasks, g, None, None, 0, False, None, deadline=time.time() + 105)
    assert batches == [["a", "b"], ["c", "d", "e"]] and list(out) == list("abcde")   # then its own (fast) rate
    batches.clear()
    assert evaluate.run_model("rl", "m", tasks, g, None, None, 0, False, None, deadline=time.time() - 1) == {}
    monkeypatch.delitem(evaluate._RATES, ("rl", "guided"))
    evaluate.run_model("rl", "m", tasks, g, None, None, 0, False, None, deadline=time.time() + 1)
    assert batches == [list("abcde")]                                   # no estimate: the whole batch


def test_every_model_writes_for_a_group_of_tasks_before_the_next(monkeypatch):
    """A step cut by its stop leaves every model's results on the same tasks: the models (and
    free sampling) take the tasks group by group, each model loaded once."""
    from types import SimpleNamespace

    calls = []

    def run_model(label, model_dir, tasks, g, *args, **kwargs):
        calls.append((label, g.guided, [t.key for t in tasks]))
        kwargs["loaded"].setdefault(model_dir, object())
        if label == "rl":
            time.sleep(0.02)
        return {t.key: label for t in tasks}

    monkeypatch.setattr(evaluate, "MODELS_GROUP", 2)
    monkeypatch.setattr(evaluate, "run_model", run_model)
    monkeypatch.setattr(evaluate, "run_metaschedule", lambda *a, **k: None)
    monkeypatch.setattr(evaluate, "sampled_refinements", lambda *a, **k: None)
    tasks = [evaluate.Task(k, "te_workload", None, timed=False) for k in "abc"]
    p = SimpleNamespace(models={"sft": "s", "rl": "r"}, candidate="rl", seed=0, rerank_oversample=1)
    measurer = SimpleNamespace(add=lambda *a: None)
    g = SimpleNamespace(guided=True)
    spent = {"set-up": 1.0}
    results, free = evaluate.evaluate_tasks(p, tasks, ["sft", "rl"], g, measurer, None, None, 4, free_on=False,
                                            progress=False, spent=spent)
    # where the step's time went, summed over the groups (rl slept 2 x 20 ms)
    assert list(spent) == ["set-up", "metaschedule", "refinement prompts", "sft", "rl"]
    assert spent["rl"] >= 0.04 and spent["sft"] < spent["rl"]
    assert evaluate._spent_line(spent).startswith("set-up 1 s")
    assert calls == [("sft", True, ["a", "b"]), ("rl", True, ["a", "b"]), ("sft", True, ["c"]), ("rl", True, ["c"])]
    assert results == {"sft": dict.fromkeys("abc", "sft"), "rl": dict.fromkeys("abc", "rl")} and free is None


def test_decoding_figures_split_the_time_only_where_every_result_has_it():
    def r(**extra):
        return {"complete": [True], "refinement": [], "tokens": 10, "generation_seconds": 2.0, "retries": 0, **extra}

    split = dict(mask_seconds=0.5, postprocess_seconds=1.0, check_seconds=3.0)
    d = evaluate.decoding_figures({"a": r(**split), "b": r(**split)})
    assert d["tokens_per_second"] == 5.0 and d["mask_seconds"] == 1.0 and d["check_seconds"] == 6.0
    d = evaluate.decoding_figures({"a": r(**split), "old": r()})      # a result kept before the split
    assert d["mask_seconds"] is None and d["postprocess_seconds"] is None


def test_rl_vs_sft_counts_only_strictly_faster_correct_kernels():
    tasks = _tasks()
    sft = {"a": {"construction": [ok(0.5)], "refinement": [{"attempts": [ok(0.3)]}]},
           "b": {"construction": [Outcome("decode", "x")], "refinement": []}}
    rl = {"a": {"construction": [ok(0.5)], "refinement": [{"attempts": [ok(0.2)]}]},
          "b": {"construction": [ok(0.9)], "refinement": []}}
    assert evaluate.rl_vs_sft(rl, sft, tasks) == {"construction_wins": 1, "construction_tasks": 2,
                                                  "refinement_wins": 1, "refinement_prompts": 1}


def test_passing_metrics_pass_the_gate():
    m = {"construction": {"correctness": 0.95, "speedup_geomean": 1.5},
         "refinement": {"correctness": 0.92, "speedup_geomean": 1.2}, "vs_metaschedule": {"latency_ratio": 0.9}}
    assert evaluate.gate(m, evaluate.DEFAULT_GATES) == {"passed": True, "reasons": []}


KERNEL_TE = """
from tvm import te
A = te.placeholder((16, 64), name="A")
B = te.placeholder((64, 64), name="B")
k = te.reduce_axis((0, 64), name="k")
C = te.compute((16, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul")
"""


@pytest.mark.parametrize("content,suffix,message", [
    ("def broken(:\n", ".py", "does not parse"),
    ("x = 1\n", ".py", "no PrimFunc"),
    ("this is not tvmscript", ".tvm", "does not parse as TVMScript"),
])
def test_optimize_rejects_bad_kernels_with_one_line(tmp_path, capsys, content, suffix, message):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    path = tmp_path / f"kernel{suffix}"
    path.write_text(content)
    assert main(["optimize", str(path), "--model", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_model_folder_that_arrived_empty_fails_at_once(tmp_path, capsys):
    """On a lent machine a model folder can arrive without its files: the evaluation says so in
    one line (exit 2) before any setup, not minutes later when the model is first loaded."""
    import time

    import yaml

    (tmp_path / "sft").mkdir()
    raw = yaml.safe_load(open("params.yaml"))
    raw["evaluate"].update(models={"sft": str(tmp_path / "sft")}, candidate="sft")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    start = time.perf_counter()
    assert main(["--params", str(params), "evaluate", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("little-dragon evaluate: evaluate.models.sft:") and "holds no model" in err and "\n" not in err
    assert time.perf_counter() - start < 30


def test_optimize_rejects_a_bad_target(tmp_path, capsys):
    path = tmp_path / "k.py"
    path.write_text(KERNEL_TE)
    assert main(["optimize", str(path), "--target", "no-such-target", "--model", str(tmp_path)]) == 2
    assert "no-such-target" in capsys.readouterr().err


@pytest.mark.slow   # 60-120 s on 2 cores: in `make test`'s second phase, so the first stays under 15 min
def test_optimize_returns_only_verified_scripts(tmp_path, capsys, cpu_target):
    from pipeline.codec import decode
    from pipeline.optimize import load_kernel
    from pipeline.verify import check_in_process

    tiny_model(tmp_path / "model", cpu_target, steps=60)
    path = tmp_path / "k.py"
    path.write_text(KERNEL_TE)
    out = tmp_path / "out"
    # guided (the default): the tiny model's scripts are valid by construction, so one is verified
    code = main(["optimize", str(path), "--model", str(tmp_path / "model"), "--attempts", "3", "--out", str(out)])
    result = json.loads((out / "result.json").read_text())
    assert code == 0 and result["verified"] and result["decoding"] == "guided"
    assert result["outcomes"]["ok"] == 3 and sum(result["outcomes"].values()) == 3
    mod = load_kernel(path)
    script = (out / "best.script").read_text()
    assert check_in_process(mod, script, cpu_target).correct
    assert result["speedup"] > 0 and "T.prim_func" in (out / "scheduled.py").read_text()
    decode(mod, script, cpu_target)
    # free sampling with the same tiny model: nothing verified, nothing but result.json written
    free_out = tmp_path / "free"
    code = main(["optimize", str(path), "--model", str(tmp_path / "model"), "--attempts", "3", "--out", str(free_out),
                 "--free"])
    result = json.loads((free_out / "result.json").read_text())
    assert result["decoding"] == "free" and sum(result["outcomes"].values()) == 3
    if code == 1:
        assert not (free_out / "best.script").exists() and "no verified script" in capsys.readouterr().err


def test_a_kernel_file_that_hangs_is_stopped(tmp_path):
    from pipeline.optimize import KernelError, load_kernel

    path = tmp_path / "k.py"
    path.write_text("import time\ntime.sleep(600)\n")
    with pytest.raises(KernelError, match="more than 3 s"):
        load_kernel(path, timeout_s=3)


def test_load_kernel_reads_tvmscript(tmp_path):
    from pipeline.optimize import load_kernel
    from pipeline.workloads import build

    path = tmp_path / "k.tvm"
    path.write_text(build(SPEC).script())
    assert "main" in [g.name_hint for g in load_kernel(path).functions]


def test_metaschedule_tunes_a_group_in_one_run_and_gives_each_kernel_its_database(tmp_path, cpu_target):
    """evaluate.metaschedule_group: kernels tuned together in one MetaSchedule run, then each in
    its own database (its records only, in measurement order) with its share of the wall time;
    a finished group is read back, not tuned again."""
    import json

    from helpers import SPEC
    from pipeline import metaschedule, records
    from pipeline.params import from_dict
    from pipeline.stages.search import SearchParams
    from pipeline.tvm_env import structural_hash
    from pipeline.workloads import Spec, build

    sp = from_dict(SearchParams, dict(target={"kind": "llvm", "num-cores": 2}, families=["matmul"], num_workloads=1,
                                      trials_per_workload=4, trials_per_iter=4, population_size=8,
                                      genetic_num_iters=1, builder_workers=2, run_timeout_s=10, min_repeat_ms=5))
    kernels = [("a", build(SPEC)), ("b", build(Spec("softmax", (8, 64), "float32")))]
    items = [(name, mod, tmp_path / name) for name, mod in kernels]
    runs = metaschedule.tune_group(items, cpu_target, 4, sp, group=2, reuse=True)
    group_seconds = None
    for (name, mod, work), tuned in zip(items, runs):
        assert tuned.trials == len(tuned.scripts) == 4
        assert records.workload_hashes(work) == [structural_hash(mod)]
        assert [r.workload_hash for r in records.scan(work)] == [structural_hash(mod)] * 4
        summary = json.loads((work / "summary.json").read_text())
        assert summary["settings"]["tasks_per_run"] == 2 and summary["group_run"]["tasks"] == ["a", "b"]
        group_seconds = summary["group_run"]["seconds"]
        assert summary["seconds"] == pytest.approx(group_seconds / 2)
    assert not list(tmp_path.glob(".group-*"))                        # the shared run's folder is gone
    again = metaschedule.tune_group(items, cpu_target, 4, sp, group=2, reuse=True)
    assert [t.scripts for t in again] == [t.scripts for t in runs] and again[0].seconds == runs[0].seconds
    assert metaschedule.finished(tmp_path / "a", cpu_target, 4, sp) is None   # not a one-kernel run's settings

    # a kept run's scripts are encoded once (scripts.json), for that run's records only
    def no_encoding(*args):
        raise AssertionError("encoded again")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metaschedule.codec, "canonical_from_json", no_encoding)
        third = metaschedule.tune_group(items, cpu_target, 4, sp, group=2, reuse=True)
    assert [t.scripts for t in third] == [t.scripts for t in runs]
    db = tmp_path / "a" / "database_tuning_record.json"
    db.write_text("".join(db.read_text().splitlines(keepends=True)[:3]))     # another run: 3 records
    fourth = metaschedule.tune_group(items, cpu_target, 4, sp, group=2, reuse=True)
    assert fourth[0].scripts == runs[0].scripts[:3] and fourth[0].run != runs[0].run


def test_a_kernel_metaschedule_raises_on_costs_only_itself(tmp_path, cpu_target, monkeypatch):
    """TVM's task scheduler raising in a group run: each task is tuned again alone; the one that
    raises alone is done with its error (no candidates), kept, and not retried by the next step."""
    from pipeline import metaschedule
    from pipeline.metaschedule import Tuned
    from pipeline.params import from_dict
    from pipeline.reward import Measurer
    from pipeline.stages.search import SearchParams
    from pipeline.workloads import build

    calls = []

    def fake_group(items, target, trials, sp, group, reuse=False):
        calls.append([name for name, _, _ in items])
        if any(name == "bad" for name, _, _ in items):              # raises in any run it is part of
            raise IndexError("Index 6 out of bounds 6")
        return [Tuned([None], [None], 1.0, 1) for _ in items]

    monkeypatch.setattr(metaschedule, "tune_group", fake_group)
    p = from_dict(evaluate.EvalParams, dict(metaschedule_group=2, archive_dir=str(tmp_path / "kept"),
                                            work_dir=str(tmp_path / "evaluate")))
    sp = from_dict(SearchParams, dict(target={"kind": "llvm", "num-cores": 2}, families=["matmul"], num_workloads=1,
                                      trials_per_workload=4, trials_per_iter=4))

    def tasks():
        return [evaluate.Task(k, "test", build(SPEC)) for k in ("good", "bad", "alone")]

    first = tasks()
    evaluate.run_metaschedule(p, first, Measurer({}, {"kind": "llvm", "num-cores": 2}), sp, cpu_target, 4, False)
    assert calls == [["good", "bad"], ["good"], ["bad"], ["alone"]]
    assert [(t.ms_done, t.ms_error) for t in first] == [(True, None), (True, "IndexError: Index 6 out of bounds 6"),
                                                        (True, None)]
    assert evaluate.missing(first, {}, None) == {}
    calls.clear()
    second = tasks()                                                   # the next step: "bad" is not tuned again
    evaluate.run_metaschedule(p, second, Measurer({}, {"kind": "llvm", "num-cores": 2}), sp, cpu_target, 4, False)
    assert calls == [["good", "alone"]] and second[1].ms_error == first[1].ms_error


class Timer:
    """A stand-in for the evaluation's measurer: script "sN" runs in N seconds; records what it timed."""

    def __init__(self):
        self.seen = []

    def measure(self, pairs):
        self.seen += [s for _, s in pairs]
        return [ok(float(s[1:])) for _, s in pairs]


def test_retiming_only_metaschedules_fastest_and_first_candidates(tmp_path, cpu_target):
    """metaschedule_retime N: the checker times MetaSchedule's first K and its N fastest (by its own
    measurement); the rest are "untimed", never a failure counted as slow. A full re-timing kept
    from an earlier step serves, restricted to the same candidates, without measuring again."""
    from dataclasses import replace

    from pipeline.metaschedule import Tuned
    from pipeline.params import from_dict

    tuned = Tuned(["s9", "s1", None, "s2", "s3"], [9.0, 1.0, None, 2.0, 3.0], 10.0, 5)
    assert evaluate.retime_selection(tuned.ms_latency_s, 1, 2) == {0, 1, 3}
    assert evaluate.retime_selection(tuned.ms_latency_s, 1, None) == {0, 1, 2, 3, 4}
    full = from_dict(evaluate.EvalParams, dict(attempts=1, archive_dir=str(tmp_path / "kept")))
    top = replace(full, metaschedule_retime=2)
    settings = {"trials": 5}

    t, timer = evaluate.Task("a", "test", None), Timer()
    evaluate._retime(top, t, tuned, timer, cpu_target, settings)
    assert timer.seen == ["s9", "s1", "s2"]
    assert [o.stage for o in t.ms_outcomes] == ["ok", "ok", "decode", "ok", "untimed"]
    assert evaluate._best(t.ms_outcomes).latency_s == 1.0

    other = from_dict(evaluate.EvalParams, dict(attempts=1, archive_dir=str(tmp_path / "kept2")))
    t, timer = evaluate.Task("a", "test", None), Timer()
    evaluate._retime(other, t, tuned, timer, cpu_target, settings)       # a full re-timing, kept
    assert timer.seen == ["s9", "s1", "s2", "s3"] and t.ms_outcomes[4].stage == "ok"
    t, timer = evaluate.Task("a", "test", None), Timer()
    evaluate._retime(replace(other, metaschedule_retime=2), t, tuned, timer, cpu_target, settings)
    assert timer.seen == [] and [o.stage for o in t.ms_outcomes] == ["ok", "ok", "decode", "ok", "untimed"]


def test_a_retiming_serves_only_the_run_it_timed(tmp_path, cpu_target):
    """A kept re-timing is keyed by its MetaSchedule run: another run with the same settings and
    as many candidates (a kept task tuned again) is re-timed, never given the old run's figures."""
    from pipeline.metaschedule import Tuned
    from pipeline.params import from_dict

    p = from_dict(evaluate.EvalParams, dict(attempts=1, archive_dir=str(tmp_path / "kept")))
    first, again = Tuned(["s1", "s2"], [1.0, 2.0], 1.0, 2, "run-a"), Tuned(["s7", "s8"], [7.0, 8.0], 1.0, 2, "run-b")
    evaluate._retime(p, evaluate.Task("a", "test", None), first, Timer(), cpu_target, {"trials": 2})
    t, timer = evaluate.Task("a", "test", None), Timer()
    evaluate._retime(p, t, again, timer, cpu_target, {"trials": 2})
    assert timer.seen == ["s7", "s8"] and [o.latency_s for o in t.ms_outcomes] == [7.0, 8.0]
    t, timer = evaluate.Task("a", "test", None), Timer()
    evaluate._retime(p, t, again, timer, cpu_target, {"trials": 2})     # the same run: served from the cache
    assert timer.seen == [] and [o.latency_s for o in t.ms_outcomes] == [7.0, 8.0]


def test_the_cost_models_pick_gives_a_place_that_does_not_compile_to_the_next_ranked():
    """evaluate.rerank_compile_check: of the K best-predicted, one that does not compile is
    replaced by the next-ranked that does, every prompt's checks side by side in rounds."""
    from types import SimpleNamespace

    from pipeline.stages.evaluate import _pick

    class Ranked:       # predicts the scripts in alphabetical order, best first
        def pick(self, mod, scripts, n, epsilon=0.05, rest=False):
            ranked = sorted(scripts)
            return ranked if rest else ranked[:n]

    calls = []

    def compiles(pairs):
        calls.append(len(pairs))
        return [not s.startswith("x") for _, s in pairs]

    def written():
        return SimpleNamespace(scripts=[["d", "xa", "b", "xb", "c", "e"], ["f", "g", "h", "f"]],
                               complete=[[True] * 6, [True, True, False, True]])

    w = written()
    n, rejected = _pick(w, ["m1", "m2"], Ranked(), 2, compiles)
    # prompt 1's order b, c, d, e, xa, xb: its best two compile, one round of checks for both prompts;
    # prompt 2's distinct complete ones are f, g
    assert w.scripts == [["b", "c"], ["f", "g"]] and n == [6, 4] and rejected == [0, 0] and calls == [4]
    w = written()
    w.scripts[0] = ["xa", "b", "xb", "xc", "c"]
    w.complete[0] = [True] * 5
    calls.clear()
    n, rejected = _pick(w, ["m1", "m2"], Ranked(), 3, compiles)
    # prompt 1's order b, c, xa, xb, xc: round 1 tries b, c, xa (xa fails), round 2 xb (fails), round 3 xc (fails)
    assert w.scripts[0][:2] == ["b", "c"] and rejected == [3, 0] and calls == [5, 1, 1]
    assert len(w.scripts[0]) == 3          # filled with what was written, checked and failing as such
    w = written()
    n, rejected = _pick(w, ["m1", "m2"], Ranked(), 2)     # no compile check: the cost model's K
    assert w.scripts == [["b", "c"], ["f", "g"]] and rejected == [0, 0]


def test_the_gpu_profiles_metaschedule_runs_keep_the_settings_of_the_kept_runs():
    """The campaign's search settings may change (profiles/gpu.yaml: 128 x 2 / 16) while the
    evaluation's MetaSchedule runs keep those of its 85 kept runs (evaluate.metaschedule_search):
    a kept run whose settings differ would be tuned again (~2 h of H200 time)."""
    import tarfile
    from pathlib import Path

    from pipeline import metaschedule
    from pipeline.params import load
    from pipeline.stages.search import SearchParams

    p, sp, _, _, target, _ = evaluate._settings("profiles/gpu.yaml")
    search = load("search", SearchParams, "profiles/gpu.yaml")
    assert (search.population_size, search.init_min_unmeasured) != (sp.population_size, sp.init_min_unmeasured)
    kept = sorted(Path("databases/evaluate-gpu/metaschedule").glob("*.tar.xz"))
    assert len(kept) >= 80
    for path in kept[:3]:
        with tarfile.open(path) as t:
            summary = json.loads(t.extractfile("summary.json").read())
        assert summary["settings"] == metaschedule.settings(target, p.metaschedule_trials, sp, p.metaschedule_group)


def test_metaschedule_search_takes_only_strategy_keys(tmp_path):
    from pipeline.params import ParamsError, from_dict

    with pytest.raises(ParamsError, match="unknown key"):
        from_dict(evaluate.EvalParams, {"metaschedule_search": {"max_mflop": 1}})
    for bad in (0, True, 2.0):     # YAML's `true` is a bool, which Python counts as the int 1
        with pytest.raises(ParamsError, match="integers >= 1"):
            from_dict(evaluate.EvalParams, {"metaschedule_search": {"population_size": bad}})
    assert from_dict(evaluate.EvalParams, {"metaschedule_search": {"population_size": 64}}).metaschedule_search == \
        {"population_size": 64}
