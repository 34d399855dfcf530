"""Shared by tests: a tiny model trained for real on scripts of one small workload; an
evaluation set up around it."""

import json
from pathlib import Path

import yaml

from pipeline.stages import sft as train_sft
from pipeline.codec import canonical_script
from pipeline.prompts import construction_prompt
from pipeline.describe import describe
from pipeline.params import from_dict
from pipeline.space import sample_many
from pipeline.workloads import Spec, build

SPEC = Spec("matmul", (16, 64, 64), "float32")


def tiny_model(out_dir, target, steps: int = 40) -> str:
    """Trains a tiny from-scratch model on 8 sampled scripts of SPEC, saves it to out_dir;
    returns SPEC's construction prompt."""
    mod = build(SPEC)
    prompt = construction_prompt(describe(mod), "llvm")
    scripts = [canonical_script(s.trace) for s in sample_many(mod, target, 8, seed=1)]
    rows = [{"prompt": prompt, "completion": s} for s in scripts] * 4
    p = from_dict(train_sft.SFTParams, dict(hidden_size=32, layers=2, heads=2, intermediate_size=64, vocab_size=400,
                                            max_length=512, pretrain_steps=0, sft_steps=steps, batch_size=8,
                                            learning_rate=3e-3, output_dir=str(out_dir)))
    model, tok, _, _ = train_sft.train(p, rows, [], progress=False)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return prompt


def search_folder(path: Path) -> None:
    """A search work folder whose one shard lists SPEC (where the stages look workloads up)."""
    shard = path / "shard-0000"
    shard.mkdir(parents=True)
    (shard / "workloads.json").write_text(json.dumps([{**SPEC.to_json(), "hash": "0", "target": "llvm"}]))


def eval_params(tmp_path, target, search: dict | None = None, **evaluate) -> Path:
    """A params file for an evaluation of a tiny model on SPEC (one test workload with a
    construction prompt) plus what `evaluate` sets; returns its path."""
    tiny_model(tmp_path / "model", target, steps=60)
    search_folder(tmp_path / "search")
    (tmp_path / "dataset").mkdir()
    prompt = construction_prompt(describe(build(SPEC)), "llvm")
    (tmp_path / "dataset" / "test.jsonl").write_text(json.dumps(
        {"workload": SPEC.id, "task": "construction", "prompt": prompt, "completion": ""}) + "\n")
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "params.yaml").read_text())
    raw["search"].update(work_dir=str(tmp_path / "search"), **(search or {}))
    raw["evaluate"].update(models={"rl": str(tmp_path / "model")}, candidate="rl", dataset_dir=str(tmp_path / "dataset"),
                           free_sampling=False, register=False, work_dir=str(tmp_path / "evaluate"), **evaluate)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    return params


def kill_a_busy_worker(client, ready, timeout_s: float = 240) -> str:
    """Once `ready()` holds, SIGKILL one Dask worker process that is running a job (any
    worker if none is busy); returns its address."""
    import os
    import signal
    import time

    deadline = time.time() + timeout_s
    while time.time() < deadline and not ready():
        time.sleep(0.1)
    pids = client.run(os.getpid)
    busy = [addr for addr, tasks in client.processing().items() if tasks]
    victim = busy[0] if busy else next(iter(pids))
    os.kill(pids[victim], signal.SIGKILL)
    return victim


def tiny_search_params():
    """The search stage's params for a 4-candidate MetaSchedule run on the CPU (one round, a
    population of 16, one build worker): what tests that tune through pipeline.metaschedule use."""
    from pipeline.stages.search import SearchParams

    return from_dict(SearchParams, dict(target={"kind": "llvm", "num-cores": 2}, families=["matmul"], num_workloads=1,
                                        trials_per_workload=4, trials_per_iter=4, population_size=16,
                                        genetic_num_iters=1, builder_workers=1, run_timeout_s=10, min_repeat_ms=5))
