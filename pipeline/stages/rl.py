"""Stage 5: reinforcement learning with the shaped, measured reward (TRL GRPOTrainer).

    little-dragon rl

Starts from `models/sft/`, samples groups of scripts for training prompts (construction and
refinement), scores each by building, running, checking and timing it (pipeline.reward), and
updates the policy with GRPO. Writes `models/rl/`, `reports/rl.json` (reward per step, each
component, failure stages), `reports/rl_reward.png`; logs to MLflow.

Under `accelerate launch` (configs/accelerate/) each process writes and measures its share of
a step's groups (its own GPU for the reward's kernels); the main process gathers the reward
log, saves and logs.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline import distributed, files, params as P, records, tracking
from pipeline.reward import Measurer, RewardParams, ShapedReward


@dataclass
class RLParams:
    model_dir: str = "models/sft"
    output_dir: str = "models/rl"
    dataset_dir: str = "data/dataset"
    report: str = "reports/rl.json"
    steps: int = 20
    num_generations: int = 4
    prompts_per_step: int = 2
    max_prompts: int = 64
    learning_rate: float = 5e-5
    beta: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 320
    bf16: bool = False
    gradient_checkpointing: bool = False
    guided: bool = True          # rollouts written by the guided decoder (false: free sampling)
    # wall-clock budget of training: stop before a step that would end past it, and save. Ctrl-C
    # or SIGTERM also saves the steps done (then exits 130); resume goes on from them
    time_limit_s: float | None = None
    # > 0: GRPO trains a fresh LoRA adapter of this rank over a full (from-scratch) SFT model, and
    # `output_dir` keeps only the adapter, naming model_dir as its base (a GPU model's RL result is
    # then ~1 MB beside the SFT weights instead of a second full copy); 0: full fine-tuning. An SFT
    # model that is itself an adapter (the 8B path) goes on training its own adapter either way.
    lora_r: int = 0
    # continue the adapter in output_dir (an earlier run's, over the same model_dir) instead of
    # starting from model_dir: GRPO on lent GPUs gets ~6 steps a 10-minute call, so its steps
    # add up over calls and sessions; the report then covers every run
    resume: bool = False
    seed: int = 0
    reward: dict = field(default_factory=dict)

    def __post_init__(self):
        P.require(self.steps > 0, "rl.steps must be > 0")
        P.require(self.num_generations >= 2, "rl.num_generations must be >= 2 (GRPO compares within a group)")
        P.require(self.prompts_per_step >= 1 and self.max_prompts >= 1, "rl.prompts_per_step/max_prompts must be >= 1")
        P.require(self.lora_r >= 0, "rl.lora_r must be >= 0 (0: full fine-tuning)")


def training_prompts(rows: list[dict], n: int, seed: int) -> list[dict]:
    """Distinct prompts, both tasks interleaved, with the columns the reward needs."""
    by_task: dict[str, dict[str, dict]] = {"construction": {}, "refinement": {}}
    for r in rows:
        by_task[r["task"]].setdefault(r["prompt"], r)
    rng = random.Random(seed)
    lists = []
    for task in ("construction", "refinement"):
        chosen = list(by_task[task].values())
        rng.shuffle(chosen)
        lists.append(chosen)
    out = []
    for pair in zip(*lists):
        out.extend(pair)
    longer = max(lists, key=len)
    out.extend(longer[len(out) // 2:])
    return [{"prompt": r["prompt"], "workload": r["workload"], "task": r["task"]} for r in out[:n]]


def _group_spread(entries: list[dict], key: str | None) -> float:
    """Mean over the step's groups (same prompt) of the standard deviation of a reward
    component (None: the total reward)."""
    import statistics

    groups: dict = {}
    for e in entries:
        groups.setdefault(e.get("prompt"), []).append(e[key] if key else e["correctness"] + e["speed"])
    spreads = [statistics.pstdev(v) for v in groups.values() if len(v) > 1]
    return sum(spreads) / len(spreads) if spreads else 0.0


def summarize(log: list[dict], history: list[dict], earlier: dict | None = None) -> dict:
    """Per-step figures of this run's reward log; with `earlier` (the report of the run this one
    resumed), its steps first, so the halves and totals cover every run."""
    steps: dict[int, list[dict]] = {}
    for e in log:
        steps.setdefault(e["step"], []).append(e)
    per_step = list(earlier["per_step"]) if earlier else []
    for step, es in sorted(steps.items()):
        n = len(es)
        per_step.append({"step": step, "completions": n,
                         "reward": sum(e["correctness"] + e["speed"] for e in es) / n,
                         "correctness": sum(e["correctness"] for e in es) / n,
                         "speed": sum(e["speed"] for e in es) / n,
                         "correct_share": sum(e["stage"] == "ok" for e in es) / n,
                         # GRPO learns from differences within a group (one prompt's completions)
                         "speed_spread": _group_spread(es, "speed"),
                         "reward_spread": _group_spread(es, None),
                         "stages": dict(Counter(e["stage"] for e in es))})
    half = max(1, len(per_step) // 2)
    first, last = per_step[:half], per_step[-half:]

    def mean(xs, k):
        return sum(x[k] for x in xs) / len(xs) if xs else None

    stages = Counter(e["stage"] for e in log) + Counter(earlier["stages"] if earlier else {})
    completions = sum(stages.values())
    return {"per_step": per_step, "stages": dict(stages), "completions": completions,
            "reward_first_half": mean(first, "reward"), "reward_second_half": mean(last, "reward"),
            "correct_share_first_half": mean(first, "correct_share"),
            "correct_share_second_half": mean(last, "correct_share"),
            "correct_share": stages["ok"] / completions if completions else None,
            "steps_with_speed_spread": sum(r["speed_spread"] > 0 for r in per_step),
            "trainer_log": (earlier["trainer_log"] if earlier else [])
            + [{k: v for k, v in h.items() if k.startswith(("reward", "loss", "step", "kl"))} for h in history]}


def resume_point(p: RLParams) -> tuple[str, dict | None]:
    """(the model to start from, the report of the run it continues or None). With `resume`,
    an adapter in output_dir over model_dir, with its report, is continued."""
    from pipeline import models

    report = Path(p.report)
    if not p.resume or not models.is_adapter(p.output_dir) or not report.exists():
        return p.model_dir, None
    earlier = json.loads(report.read_text())
    if models.base_of(p.output_dir) != str(p.model_dir) or earlier.get("start_model") != str(p.model_dir):
        print(f"rl: {p.output_dir} is not an adapter over {p.model_dir} with its report: starting from {p.model_dir}")
        return p.model_dir, None
    return p.output_dir, earlier


def steps_done(report: dict | None) -> int:
    """GRPO steps a report covers (a run stopped by its time limit did `stopped_at` of them)."""
    if not report:
        return 0
    return report.get("steps_done", report.get("stopped_at") or report.get("steps", 0))


def _plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["per_step"]
    x = [r["step"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for k in ("reward", "correctness", "speed", "speed_spread"):
        a.plot(x, [r[k] for r in rows], label=k if k != "speed_spread" else "speed spread in a group (std)",
               ls="--" if k == "speed_spread" else "-")
    a.set_xlabel("GRPO step")
    a.set_ylabel("mean reward")
    a.legend()
    stages = ["decode", "apply", "postproc", "build", "run", "numerics", "ok"]
    bottom = [0.0] * len(rows)
    for s in stages:
        share = [r["stages"].get(s, 0) / r["completions"] for r in rows]
        b.bar(x, share, bottom=bottom, label=s)
        bottom = [u + v for u, v in zip(bottom, share)]
    b.set_xlabel("GRPO step")
    b.set_ylabel("share of completions")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def guided_rollout(kernel_of: dict, temperature: float, top_p: float, max_new_tokens: int, guided: bool = True):
    """TRL's documented generation hook (`GRPOTrainer(rollout_func=...)`): each prompt's
    completions are written by the guided decoder (pipeline.generate), and GRPO trains on
    exactly those tokens. `kernel_of`: prompt -> (mod, target). The trainer's sampler repeats
    each prompt `num_generations` times in a row (a group); all the step's groups are written in
    one batch (a group a batch before: on a GPU a decoding step costs about the same for 16 rows
    as for 8, so a step's generation took `prompts_per_step` passes)."""
    from pipeline.generate import GenerationParams, generate

    def rollout(prompts: list, trainer) -> dict:
        model, tok = trainer.model, trainer.processing_class
        was_training = model.training
        groups: list[list] = []          # [prompt, completions wanted], in the sampler's order
        for prompt in prompts:
            if groups and groups[-1][0] == prompt:
                groups[-1][1] += 1
            else:
                groups.append([prompt, 1])
        written: dict[int, tuple] = {}
        by_size: dict[int, list[int]] = {}    # one batch per group size (all the same, unless the batch cut one)
        for gi, (_, n) in enumerate(groups):
            by_size.setdefault(n, []).append(gi)
        for n, gis in by_size.items():
            g = GenerationParams(attempts=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                 guided=guided, retries=0, batch_rows=n * len(gis))
            w = generate(model, tok, [groups[gi][0] for gi in gis], g, seed=trainer.state.global_step * 1000 + n,
                         kernels=[kernel_of[groups[gi][0]] for gi in gis])
            for k, gi in enumerate(gis):
                written[gi] = (w.token_ids[k], w.complete[k])
        prompt_ids, completion_ids, complete = [], [], []
        for gi, (prompt, _) in enumerate(groups):
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            for x, c in zip(*written[gi]):
                prompt_ids.append(ids)
                completion_ids.append(x or [tok.eos_token_id])
                complete.append(c)
        model.train(was_training)
        # extra fields reach the reward functions: an incomplete guided script scores as a failure
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "complete": complete}

    return rollout


def train(p: RLParams, prompts: list[dict], specs: dict, target_spec, progress: bool = True,
          start_dir: str | None = None, seed: int | None = None):
    """GRPO from `start_dir` (default model_dir; resume_point gives an earlier run's adapter)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from pipeline import models

    start_dir = start_dir or p.model_dir
    rp = P.from_dict(RewardParams, p.reward, "rl.reward")
    model, tokenizer = models.load(start_dir, trainable=True)
    reward = ShapedReward(Measurer(specs, target_spec, rp.timeout_s, rp.workers), rp)
    args = GRPOConfig(
        output_dir=str(Path(p.output_dir).parent / ".rl-work"), max_steps=p.steps,
        per_device_train_batch_size=distributed.per_device_batch(p.prompts_per_step * p.num_generations),
        num_generations=p.num_generations,
        learning_rate=p.learning_rate, beta=p.beta, temperature=p.temperature, top_p=p.top_p,
        max_completion_length=p.max_completion_length, logging_steps=1, save_strategy="no", report_to="none",
        seed=p.seed if seed is None else seed, bf16=p.bf16, gradient_checkpointing=p.gradient_checkpointing,
        use_cpu=not torch.cuda.is_available(), disable_tqdm=not progress, dataloader_num_workers=0)
    from pipeline.tvm_env import make_target
    from pipeline.workloads import Spec, build

    target = make_target(target_spec)
    mods = {w: build(Spec.from_json(specs[w])) for w in {r["workload"] for r in prompts}}
    kernel_of = {r["prompt"]: (mods[r["workload"]], target) for r in prompts}
    rollout = guided_rollout(kernel_of, p.temperature, p.top_p, p.max_completion_length, p.guided)
    from pipeline.budget import interrupts, time_limit

    stop = time_limit(p.time_limit_s)
    peft_config = None
    if p.lora_r and not models.is_adapter(start_dir):
        from peft import LoraConfig

        model.config._name_or_path = str(p.model_dir)      # the adapter's base, as the registry and loader read it
        peft_config = LoraConfig(r=p.lora_r, lora_alpha=2 * p.lora_r, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward.functions(), args=args,
                          train_dataset=Dataset.from_list(prompts), processing_class=tokenizer, rollout_func=rollout,
                          callbacks=[stop], peft_config=peft_config)
    interrupted = False
    with interrupts():
        try:
            trainer.train()
        except KeyboardInterrupt:
            if distributed.world_size() > 1:   # the processes' states may differ mid-step: nothing safe to save
                raise
            interrupted = True
    model = distributed.unsharded(trainer, str(Path(args.output_dir) / "final"))
    stopped_at = trainer.state.global_step if interrupted else stop.stopped_at
    return model, tokenizer, reward, trainer.state.log_history, stopped_at, interrupted


def main(params_path: str = "params.yaml", progress: bool = True) -> dict:
    import yaml

    p = P.load("rl", RLParams, params_path)
    raw = yaml.safe_load(Path(params_path).read_text())
    rows = list(files.read_jsonl(Path(p.dataset_dir) / "train.jsonl"))
    start_dir, earlier = resume_point(p)
    before = steps_done(earlier)
    seed = p.seed + before                 # a resumed run draws other prompts than the runs before it
    prompts = training_prompts(rows, p.max_prompts, seed)
    specs = records.workload_entries(raw["data"]["search_dir"])
    start = time.perf_counter()
    model, tokenizer, reward, history, stopped_at, interrupted = train(p, prompts, specs, raw["search"]["target"],
                                                                       progress, start_dir=start_dir, seed=seed)
    seconds = time.perf_counter() - start
    log = distributed.gather(reward.log)                  # every process's rollouts, all ranks take part
    checked = sum(distributed.gather([reward.measurer.builds]))
    if not distributed.is_main():
        return {}
    done = stopped_at if stopped_at is not None else p.steps
    if interrupted and not done:
        print("rl: interrupted before its first step ended: nothing to save", file=sys.stderr)
        raise SystemExit(130)
    out = files.save_model_dir(model, tokenizer, p.output_dir, bf16=p.bf16)   # a fresh folder, swapped in
    log = [e for e in log if e["step"] <= done]           # an interrupted step's rollouts did not train the model
    for e in log:
        e["step"] += before
    summary = summarize(log, history, earlier)
    run = {"resumed_from": start_dir if earlier else None, "steps": done, "seconds": round(seconds, 1),
           "time_limit_s": p.time_limit_s, "checked_scripts": checked, "interrupted": interrupted}
    report = {"start_model": p.model_dir, "train_seconds": round(seconds + (earlier or {}).get("train_seconds", 0), 1),
              "steps": p.steps, "steps_done": before + done, "runs": (earlier or {}).get("runs", []) + [run],
              "time_limit_s": p.time_limit_s, "stopped_at": stopped_at,
              "prompts": len(prompts), "checked_scripts": checked + (earlier or {}).get("checked_scripts", 0),
              "processes": distributed.world_size(),
              "cache_entries": len(reward.measurer.cache), "reward_params": asdict(reward.rp),
              **summary}
    files.write_json(p.report, report)
    plot = str(Path(p.report).with_name("rl_reward.png"))
    _plot(summary, plot)
    curve = [("reward", r["step"], r["reward"]) for r in summary["per_step"]]
    metrics = {k: report[k] for k in ("train_seconds", "reward_first_half", "reward_second_half",
                                       "correct_share_first_half", "correct_share_second_half")
               if report[k] is not None}
    report["mlflow_run_id"] = tracking.log_run("rl", asdict(p), metrics, curve, [p.report, plot])
    files.write_json(p.report, report)
    print(f"rl: {done} GRPO steps in {seconds:.0f} s ({before + done} in all), {checked} scripts checked; mean reward "
          f"{summary['reward_first_half']:.3f} (first half) -> {summary['reward_second_half']:.3f} (second half); "
          f"stages {summary['stages']} -> {out}, {p.report}")
    if interrupted:
        print(f"rl: interrupted: the {done} steps done are saved; `rl.resume` goes on from them", file=sys.stderr)
        raise SystemExit(130)
    return report
