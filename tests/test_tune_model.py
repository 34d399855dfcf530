"""`little-dragon tune-model`: every task of a Relax network tuned by the model into
MetaSchedule databases, the network compiled with them, checked and timed end to end."""

import json

import pytest

from helpers import tiny_model
from pipeline.cli import main

NETWORK = """
from tvm.relax.frontend import nn


class GatedMLP(nn.Module):
    def __init__(self):
        self.gate = nn.Linear(64, 64, bias=False)
        self.up = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return nn.op.silu(self.gate(x)) * self.up(x)


mod, _ = GatedMLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((16, 64), "float32")}})
"""


@pytest.mark.slow   # 60-120 s on 2 cores: in `make test`'s second phase, so the first stays under 15 min
def test_tune_model_tunes_every_task_and_the_network_end_to_end(tmp_path, capsys, cpu_target):
    from pipeline import tune_model as tm
    from pipeline.tvm_env import ms

    tiny_model(tmp_path / "model", cpu_target, steps=60)
    net = tmp_path / "net.py"
    net.write_text(NETWORK)
    work = tmp_path / "tuned"
    args = ["tune-model", str(net), "--model", str(tmp_path / "model"), "--trials-per-task", "3", "--batch", "4",
            "--work-dir", str(work), "--quiet"]
    assert main(args) == 0
    result = json.loads((work / "result.json").read_text())
    tasks = tm.extract_tasks(tm.load_network(net), cpu_target)
    assert len(result["tasks"]) == len(tasks) >= 2
    assert result["matches_untuned"] is True and result["tuned_latency_s"] > 0 and result["untuned_latency_s"] > 0
    # each task's database is MetaSchedule's: TVM reads it and finds the task's best schedule
    for task in tasks:
        folders = list((work / "tasks").glob(f"*-{task.task_name}"))
        assert len(folders) == 1
        db = ms.database.JSONDatabase(work_dir=str(folders[0]))
        assert db.get_all_tuning_records() and db.query_schedule(task.dispatched[0], cpu_target, "main") is not None
    measured = result["measured"]
    assert 0 < measured <= 3 * len(tasks)
    # resume: nothing measured twice
    assert main(args) == 0
    assert json.loads((work / "result.json").read_text())["measured"] == measured
    assert "outputs match" in capsys.readouterr().out


@pytest.mark.slow   # ~2 min on 2 cores each (MetaSchedule's search per task, population 512 x 4)
@pytest.mark.parametrize("strategy", ["ms-cost", "ms-rank"])
def test_tune_model_ms_cost_tunes_every_task_with_one_pretrained_cost_model(tmp_path, capsys, cpu_target, strategy):
    from test_cost_model import _database

    from pipeline import files
    from pipeline import tune_model as tm
    from pipeline.tune_search import SOURCE
    from pipeline.tvm_env import ms
    from pipeline.workloads import Spec

    _database(tmp_path / "search", cpu_target, [Spec("matmul", (8, 32, 48), "float32")], 10)
    net = tmp_path / "net.py"
    net.write_text(NETWORK)
    work = tmp_path / "tuned"
    args = ["tune-model", str(net), "--strategy", strategy, "--cost-data", str(tmp_path / "search"),
            "--trials-per-task", "3", "--work-dir", str(work), "--quiet"]
    assert main(args) == 0
    result = json.loads((work / "result.json").read_text())
    tasks = tm.extract_tasks(tm.load_network(net), cpu_target)
    assert result["strategy"] == strategy and len(result["tasks"]) == len(tasks) >= 2
    # MetaSchedule stops a task early when its design space has no unmeasured candidate left
    # (an elementwise task has a handful), so up to 3 a task
    assert result["matches_untuned"] is True and len(tasks) < result["measured"] <= 3 * len(tasks)

    def per_task():
        out = []
        for task in tasks:
            (folder,) = (work / "tasks").glob(f"*-{task.task_name}")
            rows = list(files.read_jsonl(folder / "tune.jsonl"))
            assert rows and {r["source"] for r in rows} == {SOURCE} and len({r["script"] for r in rows}) == len(rows)
            db = ms.database.JSONDatabase(work_dir=str(folder))
            assert len(db.get_all_tuning_records()) == len(rows) <= 3
            assert db.query_schedule(task.dispatched[0], cpu_target, "main") is not None
            out.append(rows)
        return out

    first = per_task()
    assert sum(map(len, first)) == result["measured"]
    assert main(args) == 0       # resume: what was measured stays, nothing measured twice
    again = per_task()
    assert all(b[: len(a)] == a for a, b in zip(first, again))
    assert json.loads((work / "result.json").read_text())["measured"] == sum(map(len, again))
    assert f"tune-model ({strategy})" in capsys.readouterr().out


@pytest.mark.parametrize("text,extra,message", [
    ("x = 1\n", [], "defines no Relax IRModule"),
    ("raise SystemError('boom')\n", [], "running it raised"),
    (NETWORK, ["--trials-per-task", "0"], "--trials-per-task must be >= 1"),
    (NETWORK, ["--target", "no-such-target"], "no-such-target"),
    (NETWORK, ["--strategy", "ms-cost"], "for --strategy model"),       # with --model
    (NETWORK, ["--strategy", "ms-rank"], "for --strategy model (ms-rank"),
    (NETWORK, ["--focus", "8"], "--focus is for --strategy ms-cost"),
])
def test_tune_model_rejects_bad_input_with_one_line(tmp_path, capsys, text, extra, message):
    net = tmp_path / "net.py"
    net.write_text(text)
    (tmp_path / "m").mkdir()
    assert main(["tune-model", str(net), "--model", str(tmp_path / "m"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_tune_model_rejects_a_file_that_is_not_python(tmp_path, capsys):
    net = tmp_path / "net.txt"
    net.write_text("hello")
    (tmp_path / "m").mkdir()
    assert main(["tune-model", str(net), "--model", str(tmp_path / "m")]) == 2
    assert "not a Python file" in capsys.readouterr().err


@pytest.mark.slow     # three Relax tunings and four end-to-end builds (~2 min)
def test_bench_ms_cost_tunes_the_network_with_the_pretrained_cost_model_at_equal_trials(tmp_path, cpu_target):
    from pipeline.bench.tune_model import run_network
    from pipeline.cost_model import CostModel

    net = tmp_path / "net.py"
    net.write_text(NETWORK)
    made = []

    def cost(train=True):
        made.append(train)
        return CostModel(cpu_target)

    row = run_network(str(net), None, {"kind": "llvm", "num-cores": 2}, 2, tmp_path / "work", ["ms_cost", "ms_rank"],
                      cost, final_rounds=2)
    assert made == [False, False] and "model" not in row     # each trains its own MetaSchedule cost model
    assert row["ms_rank"]["matches_untuned"] is True and 0 < row["ms_rank"]["measured"] <= 2 * row["tasks"]
    ms_row, ours = row["metaschedule"], row["ms_cost"]
    assert ms_row["matches_untuned"] is True and ours["matches_untuned"] is True
    assert 0 < ours["measured"] <= 2 * row["tasks"] and 0 < ms_row["measured"] <= 2 * row["tasks"]
    assert row["ms_cost_over_ms"] == ours["latency_s"] / ms_row["latency_s"] > 0
    # every contender's network, the untuned one too, timed again side by side: a median of 2 rounds each
    final = row["final"]
    assert final["rounds"] == 2 and set(final["latency_s"]) == {"untuned", "metaschedule", "ms_cost", "ms_rank"}
    for key, (low, high) in final["spread_s"].items():
        assert 0 < low <= final["latency_s"][key] <= high
    assert row["final_ms_cost_over_ms"] == final["latency_s"]["ms_cost"] / final["latency_s"]["metaschedule"]
