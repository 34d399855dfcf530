"""Benchmark: the SFT stage on 1 and on N GPUs under `accelerate launch` (data parallel, the
same params: `batch_size` is the global batch, so every run takes the same optimisation steps
with the same learning-rate schedule), on the project's real training examples. Reports each
run's loss curve, examples per second and the speed-up, and how far the curves are apart.

    python -m pipeline.bench.sft_scaling --params profiles/gpu.yaml --gpus 1 2 --time-limit 60 \\
        --out reports/gpu/sft_scaling.json
    python -m pipeline.bench.sft_scaling --reports one_gpu/sft.json two_gpus/sft.json --out ...

The first form runs the stage itself (`python -m accelerate.commands.launch ... -m pipeline.cli
sft`) once per GPU count, each stopped by `time_limit_s` (validation off); the second compares
SFT reports already written (e.g. a full training run on 2 GPUs against a short one on 1 with
the same params). Speed is the trainer's own time (`runtime_s`); the curves are compared on
the logged steps both runs reached.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml


def run(params: str, gpus: int, time_limit: float, work: Path) -> str:
    """One SFT run on `gpus` GPUs; returns its report's path."""
    raw = yaml.safe_load(Path(params).read_text())
    report = work / f"sft-{gpus}.json"
    raw["sft"].update(eval_prompts=0, time_limit_s=time_limit, output_dir=str(work / f"sft-{gpus}"), report=str(report))
    path = work / f"params-{gpus}.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--num_processes", str(gpus)]
    cmd += ["--multi_gpu"] if gpus > 1 else []
    cmd += ["-m", "pipeline.cli", "--params", str(path), "sft", "--quiet"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)), "LITTLE_DRAGON_MLFLOW": "defer"}
    subprocess.run(cmd, env=env, check=True)
    return str(report)


def summary(path: str, batch: int) -> dict:
    r = json.loads(Path(path).read_text())
    curve = [(s, loss) for ph, s, loss in r["history"] if ph == "sft"]
    steps = r["stopped_at"].get("sft") or max(s for s, _ in curve)
    runtime = r["runtime_s"]["sft"]
    return {"report": path, "gpus": r["processes"], "steps": steps, "global_batch": batch, "train_seconds": runtime,
            "examples_per_second": round(steps * batch / runtime, 1), "loss": curve}


def compare(runs: list[dict]) -> list[dict]:
    base = runs[0]
    for r in runs:
        r["speedup"] = round(r["examples_per_second"] / base["examples_per_second"], 2)
        mine = dict(r["loss"])
        common = [(x, mine[s]) for s, x in base["loss"] if s in mine]
        r["common_logged_steps"] = len(common)
        r["mean_abs_loss_gap_vs_first"] = round(sum(abs(x - y) for x, y in common) / len(common), 4) if common else None
    return runs


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in runs:
        ax.plot([s for s, _ in r["loss"]], [v for _, v in r["loss"]], marker=".",
                label=f"{r['gpus']} GPU{'s' if r['gpus'] > 1 else ''}: {r['examples_per_second']} examples/s")
    ax.set_xlabel("step (same global batch and schedule)")
    ax.set_ylabel("SFT loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="profiles/gpu.yaml")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds of training per run")
    ap.add_argument("--reports", nargs="+", help="compare these SFT reports instead of running")
    ap.add_argument("--work", default="data/bench-sft-scaling")
    ap.add_argument("--out", default="reports/gpu/sft_scaling.json")
    a = ap.parse_args()
    batch = yaml.safe_load(Path(a.params).read_text())["sft"]["batch_size"]
    if a.reports:
        paths = a.reports
    else:
        work = Path(a.work)
        work.mkdir(parents=True, exist_ok=True)
        paths = [run(a.params, g, a.time_limit, work) for g in a.gpus]
    runs = compare(sorted((summary(p, batch) for p in paths), key=lambda r: r["gpus"]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"params": a.params, "runs": runs}, indent=1))
    plot(runs, str(Path(a.out).with_suffix(".png")))
    for r in runs:
        print(f"{r['gpus']} GPU(s): {r['steps']} steps, {r['examples_per_second']} examples/s (x{r['speedup']}), "
              f"loss gap {r['mean_abs_loss_gap_vs_first']} over {r['common_logged_steps']} logged steps")


if __name__ == "__main__":
    main()
