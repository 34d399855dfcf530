"""Training under `accelerate launch`: SFT data parallel over 2 processes (torchrun through
accelerate's multi-GPU launcher; on a machine without GPUs the trainer falls back to CPU and gloo) takes
the same steps on the same global batch as one process; only the main process saves, reports
and logs to MLflow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import distributed
from pipeline.params import ParamsError

ROOT = Path(__file__).resolve().parent.parent
ROWS = [{"prompt": f"target: llvm\nargs: A f32[{n},64]\n### script\n", "task": "construction", "workload": "w",
         "completion": f"B matmul\nL b0 3\nT l1 1,{n}\nS l1 v4-5"} for n in (2, 4, 8, 16, 32, 64, 128, 256)] * 8


def _sft(tmp_path: Path, name: str, processes: int, config: str | None = None, lora: bool = False) -> dict:
    work = tmp_path / name
    data = work / "data"
    data.mkdir(parents=True)
    base = _lora_base(work) if lora else None
    for split, rows in (("train", ROWS), ("val", ROWS[:2]), ("corpus", [])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["data"]["search_dir"] = str(work / "search")
    raw["sft"].update(hidden_size=32, layers=2, heads=2, intermediate_size=64, vocab_size=300, max_length=128,
                      pretrain_steps=0, sft_steps=40, batch_size=8, learning_rate=1e-2, eval_prompts=0,
                      dataset_dir=str(data), output_dir=str(work / "models" / "sft"), report=str(work / "sft.json"),
                      base_model=base, bf16=lora)
    (work / "params.yaml").write_text(yaml.safe_dump(raw))
    launch = [sys.executable, "-m", "accelerate.commands.launch"]     # the launcher of this interpreter
    if config:
        launcher = [*launch, "--config_file", str(ROOT / config), "--num_processes", str(processes), "-m"]
    elif processes > 1:
        launcher = [*launch, "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
                    "--mixed_precision", "no", "--dynamo_backend", "no", "-m"]
    else:
        launcher = [sys.executable, "-m"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
           "OMP_NUM_THREADS": "1"}
    if processes == 1:
        env["CUDA_VISIBLE_DEVICES"] = "0"     # one process, one GPU (TRL refuses nn.DataParallel over several)
    cmd = [*launcher, "pipeline.cli", "--params", str(work / "params.yaml"), "sft", "--quiet"]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((work / "sft.json").read_text())


@pytest.mark.slow
def test_sft_on_two_processes_matches_one(tmp_path):
    one, two = _sft(tmp_path, "one", 1), _sft(tmp_path, "two", 2)
    assert one["processes"] == 1 and two["processes"] == 2
    curve1 = [loss for phase, _, loss in one["history"] if phase == "sft"]
    curve2 = [loss for phase, _, loss in two["history"] if phase == "sft"]
    print("1 process:", [round(x, 3) for x in curve1], "\n2 processes:", [round(x, 3) for x in curve2])
    assert len(curve1) == len(curve2) >= 10               # the same optimisation steps
    assert curve2[-1] < curve2[0] * 0.7                  # it learns on two processes too
    # the same curve within noise (different data order): mean gap small against the drop
    gap = sum(abs(a - b) for a, b in zip(curve1, curve2)) / len(curve1)
    assert gap < 0.25 * (curve1[0] - curve1[-1]), (curve1, curve2)
    # one model, one report, one MLflow run: the main process alone wrote them
    assert (tmp_path / "two" / "models" / "sft" / "config.json").exists()
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'two' / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True)
    assert len(runs) == 1 and runs.iloc[0]["tags.mlflow.runName"] == "sft"


DRIVER = """
import json, sys
from pipeline import distributed
from pipeline.params import from_dict
from pipeline.stages import rl
model_dir, out, prompt, spec_id, spec = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
p = from_dict(rl.RLParams, dict(model_dir=model_dir, output_dir=out + "/rl", steps=2, num_generations=2,
                                prompts_per_step=2, max_completion_length=400, reward={"workers": 1, "timeout_s": 60}))
prompts = [{"prompt": prompt, "workload": spec_id, "task": "construction"}] * 8
model, tok, reward, history, _, _ = rl.train(p, prompts, {spec_id: spec}, {"kind": "llvm", "num-cores": 2}, progress=False)
log = distributed.gather(reward.log)
if distributed.is_main():
    json.dump({"mine": len(reward.log), "all": log, "world": distributed.world_size()}, open(out + "/rl.json", "w"))
"""


@pytest.mark.slow
def test_grpo_on_two_processes_gathers_every_rollout(tmp_path, cpu_target):
    """GRPO under the launcher: each process writes and measures its share of a step's
    completions; the main process sees all of them."""
    from helpers import SPEC, tiny_model

    prompt = tiny_model(tmp_path / "sft", cpu_target)
    (tmp_path / "driver.py").write_text(DRIVER)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(tmp_path / "driver.py"),
           str(tmp_path / "sft"), str(tmp_path), prompt, SPEC.id, json.dumps(SPEC.to_json())]
    done = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "rl.json").read_text())
    assert out["world"] == 2 and out["mine"] == 4                 # 2 steps x (4 completions / 2 processes)
    assert len(out["all"]) == 8 and {e["step"] for e in out["all"]} == {1, 2}
    assert sum(e["stage"] == "ok" for e in out["all"]) >= 6         # guided rollouts on both processes


def test_the_global_batch_is_split_over_the_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.per_device_batch(8) == 4
    with pytest.raises(ParamsError, match="multiple of the 2 training processes"):
        distributed.per_device_batch(5)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.per_device_batch(5) == 5 and distributed.gather([1, 2]) == [1, 2]


def _lora_base(work: Path) -> str:
    """A local 'pretrained' base (no hub here): a tiny Llama with the project's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.stages import sft

    p = sft.SFTParams(vocab_size=300)
    tok = sft.make_tokenizer(p, [r["prompt"] + r["completion"] for r in ROWS])
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=128, max_position_embeddings=256, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)).save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    return str(work / "base")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_sft_ddp_and_fsdp_lora_on_two_gpus(tmp_path):
    """On the 2-GPU machine: the DDP config and the sharded LoRA config (the 8B path) both
    train and leave one loadable model / adapter."""
    from pipeline import models

    one = _sft(tmp_path, "one", 1)
    ddp = _sft(tmp_path, "ddp", 2, config="configs/accelerate/ddp.yaml")
    c1 = [x for ph, _, x in one["history"] if ph == "sft"]
    c2 = [x for ph, _, x in ddp["history"] if ph == "sft"]
    print("1 GPU:", [round(x, 3) for x in c1], "\n2 GPUs:", [round(x, 3) for x in c2])
    assert ddp["processes"] == 2 and len(c1) == len(c2)
    assert sum(abs(a - b) for a, b in zip(c1, c2)) / len(c1) < 0.25 * (c1[0] - c1[-1])
    fsdp = _sft(tmp_path, "fsdp", 2, config="configs/accelerate/fsdp-lora.yaml", lora=True)
    assert fsdp["processes"] == 2
    assert models.is_adapter(tmp_path / "fsdp" / "models" / "sft")
    model, _ = models.load(tmp_path / "fsdp" / "models" / "sft", merge=False)
    assert any("lora_" in n for n, _ in model.named_parameters())
