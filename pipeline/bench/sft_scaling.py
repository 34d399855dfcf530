"""Benchmark: the SFT stage on 1 and on N GPUs under `accelerate launch` (data parallel, the
same params: `batch_size` is the global batch), on the project's real training examples.
Reports each run's loss curve, training seconds and examples per second, and the speed-up.

    python -m pipeline.bench.sft_scaling --params profiles/gpu.yaml --steps 200 --gpus 1 2 \\
        --out reports/gpu/sft_scaling.json

Each run is the stage itself (`python -m accelerate.commands.launch ... -m pipeline.cli sft`)
with its steps, output folder and report redirected; pre-training and the validation
generation are off, so `train_seconds` is the trainer's own training time; the stage's
(tokenizer included) and the launcher's wall time are reported apart as `stage_train_seconds`
and `wall_seconds`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml


def run(params: str, steps: int, gpus: int, work: Path) -> dict:
    raw = yaml.safe_load(Path(params).read_text())
    raw["sft"].update(pretrain_steps=0, sft_steps=steps, eval_prompts=0, time_limit_s=None,
                      output_dir=str(work / f"sft-{gpus}"), report=str(work / f"sft-{gpus}.json"))
    path = work / f"params-{gpus}.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--num_processes", str(gpus)]
    cmd += ["--multi_gpu"] if gpus > 1 else []
    cmd += ["-m", "pipeline.cli", "--params", str(path), "sft", "--quiet"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)), "LITTLE_DRAGON_MLFLOW": "defer"}
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    wall = time.perf_counter() - start
    report = json.loads((work / f"sft-{gpus}.json").read_text())
    curve = [(s, loss) for ph, s, loss in report["history"] if ph == "sft"]
    batch = raw["sft"]["batch_size"]
    return {"gpus": gpus, "processes": report["processes"], "steps": steps, "global_batch": batch,
            "train_seconds": report["runtime_s"]["sft"], "stage_train_seconds": report["train_seconds"],
            "wall_seconds": round(wall, 1),
            "examples_per_second": round(steps * batch / report["runtime_s"]["sft"], 1), "loss": curve}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in result["runs"]:
        ax.plot([s for s, _ in r["loss"]], [v for _, v in r["loss"]],
                label=f"{r['gpus']} GPU{'s' if r['gpus'] > 1 else ''}: {r['examples_per_second']} examples/s")
    ax.set_xlabel("step (same global batch)")
    ax.set_ylabel("SFT loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="profiles/gpu.yaml")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--work", default="data/bench-sft-scaling")
    ap.add_argument("--out", default="reports/gpu/sft_scaling.json")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = [run(a.params, a.steps, g, work) for g in a.gpus]
    base = runs[0]
    for r in runs:
        r["speedup"] = round(r["examples_per_second"] / base["examples_per_second"], 2)
        common = [(x, y) for (s1, x), (s2, y) in zip(base["loss"], r["loss"]) if s1 == s2]
        r["mean_abs_loss_gap_vs_first"] = round(sum(abs(x - y) for x, y in common) / len(common), 4) if common else None
    import torch

    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "params": a.params, "runs": runs}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    plot(result, str(Path(a.out).with_suffix(".png")))
    for r in runs:
        print(f"{r['gpus']} GPU(s): {r['examples_per_second']} examples/s (x{r['speedup']}), "
              f"loss {r['loss'][0][1]:.3f} -> {r['loss'][-1][1]:.3f}, gap {r['mean_abs_loss_gap_vs_first']}")


if __name__ == "__main__":
    main()
