"""The MLflow registry against a real store in a temporary directory: a passing version
becomes champion, a failing one is tagged with its reasons and the champion stays; pull
fetches the champion; the registered pyfunc loads and writes scripts."""

from pathlib import Path

import pytest

from helpers import tiny_model

from pipeline import models, registry


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def test_promotion_refusal_and_pull(store, cpu_target):
    import mlflow
    from mlflow import MlflowClient

    prompt = tiny_model(store / "model", cpu_target, steps=10)
    with pytest.raises(registry.RegistryError, match="no version"):
        registry.pull(store / "pulled")
    good = {"passed": True, "reasons": []}
    v1 = registry.register("sft", str(store / "model"), {"attempts": 4}, {"construction.correctness": 0.95}, [], [], good)
    registry.promote(v1["version"])
    assert registry.champion()["version"] == v1["version"] == 1
    # a retried evaluation registers nothing twice
    again = registry.register("sft", str(store / "model"), {"attempts": 4}, {"construction.correctness": 0.95}, [], [], good)
    assert again["version"] == 1 and again["already_registered"]
    bad = {"passed": False, "reasons": ["construction correctness 0.1 < 0.9"]}
    v2 = registry.register("rl", str(store / "model"), {}, {"construction.correctness": 0.1}, [], [], bad)
    assert v2["version"] == 2 and registry.champion()["version"] == 1   # refused: champion stays
    tags = MlflowClient().get_model_version(registry.NAME, "2").tags
    assert tags["gate"] == "failed" and "0.1 < 0.9" in tags["gate_reasons"]
    dest = registry.pull(store / "pulled")
    model, tok = models.load(dest)
    assert model.config.hidden_size == 32
    pyfunc = mlflow.pyfunc.load_model(f"models:/{registry.NAME}@{registry.ALIAS}")
    import pandas as pd

    from helpers import SPEC

    from pipeline.codec import decode
    from pipeline.workloads import build

    mod = build(SPEC)
    out = pyfunc.predict(pd.DataFrame({"kernel": [mod.script()], "target": ['{"kind": "llvm", "num-cores": 2}']}),
                         params={"attempts": 2, "max_new_tokens": 600})
    assert len(out) == 1 and len(out[0]) == 2
    for script in out[0]:        # guided by the kernel: every script valid
        decode(mod, script, cpu_target)
    free = pyfunc.predict(pd.DataFrame({"prompt": [prompt]}), params={"attempts": 2, "max_new_tokens": 16})
    assert len(free) == 1 and len(free[0]) == 2 and all(isinstance(s, str) for s in free[0])


def test_pull_refuses_a_folder_that_is_not_a_model(store, cpu_target):
    tiny_model(store / "model", cpu_target, steps=2)
    v = registry.register("sft", str(store / "model"), {}, {}, [], [], {"passed": True, "reasons": []})
    registry.promote(v["version"])
    precious = store / "my-notes"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(registry.RegistryError, match="not a model folder"):
        registry.pull(precious)
    assert (precious / "thesis.tex").read_text() == "years of work"
    # a model folder is replaced whole, and nothing is left beside it
    old = store / "champ"
    registry.pull(old)
    (old / "stale.txt").write_text("x")
    registry.pull(old)
    assert models.is_model_dir(old) and not (old / "stale.txt").exists()
    assert [p.name for p in store.iterdir() if p.name.startswith(".champ")] == []


def test_saving_a_model_over_a_lora_folder_leaves_no_adapter_behind(store, cpu_target):
    from pipeline import files

    tiny_model(store / "model", cpu_target, steps=2)
    model, tok = models.load(store / "model")
    dest = store / "out"
    dest.mkdir()
    (dest / "adapter_config.json").write_text('{"base_model_name_or_path": "/nowhere"}')
    files.save_model_dir(model, tok, dest)
    assert not models.is_adapter(dest) and models.load(dest)[0].config.hidden_size == 32


def test_a_run_made_without_mlflow_is_kept_and_logged_later(store, monkeypatch):
    """The GPU machines have no MLflow: a run is kept with a copy of its artifacts, then logged."""
    from pipeline import tracking
    monkeypatch.setenv("LITTLE_DRAGON_MLFLOW", "defer")
    Path("r.json").write_text('{"a": 1}')
    rid = tracking.log_run("sft", {"lr": 0.1, "gen": {"k": 2}}, {"loss": 0.5}, [("sft_loss", 1, 0.9), ("sft_loss", 2, 0.5)], ["r.json", "missing.png"])
    assert rid.startswith("pending:")
    kept = [d for d in tracking.PENDING.iterdir()]
    assert len(kept) == 1 and (kept[0] / "artifacts" / "r.json").read_text() == '{"a": 1}'
    monkeypatch.delenv("LITTLE_DRAGON_MLFLOW")
    done = tracking.sync()
    assert len(done) == 1 and not any(tracking.PENDING.iterdir())
    import mlflow
    client = mlflow.tracking.MlflowClient(tracking.tracking_uri())
    run = client.get_run(done[0][1])
    assert run.data.metrics["loss"] == 0.5 and run.data.params["lr"] == "0.1"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "sft_loss")] == [0.9, 0.5]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["r.json"]
    assert tracking.sync() == []


def test_a_lora_adapter_is_saved_with_its_target_modules_sorted(store, cpu_target):
    """PEFT writes `target_modules` in a set's order (it changes from process to process, and
    with it the model digest that keys the evaluation's kept results): saved, they are sorted."""
    import json

    from peft import LoraConfig, get_peft_model

    from pipeline import files

    tiny_model(store / "model", cpu_target, steps=2)
    model, tok = models.load(store / "model")
    lora = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"))
    files.save_model_dir(lora, tok, store / "a")
    files.save_model_dir(lora, tok, store / "b")
    saved = json.loads((store / "a" / "adapter_config.json").read_text())["target_modules"]
    assert len(saved) >= 7 and saved == sorted(saved)
    assert registry.model_digest(store / "a") == registry.model_digest(store / "b")
    assert models.is_adapter(store / "a")
