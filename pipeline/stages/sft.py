"""Stage 4: supervised fine-tuning (TRL SFTTrainer; PEFT LoRA for a pretrained base).

    little-dragon sft

Default: a small Llama-style decoder trained from scratch with the project's own tokenizer:
first language modelling on the pre-training corpus (scripts sampled from design spaces),
then SFT on construction + refinement examples with the loss on the completion only.
With `sft.base_model` set to a local directory of a pretrained causal LM (up to 8B), the
base's tokenizer is used and training is LoRA (bf16, gradient checkpointing). No network.

Data parallel on several devices with the same params (`batch_size` is the global batch):
    accelerate launch --config_file configs/accelerate/ddp.yaml -m pipeline.cli sft
and for the 8B LoRA case, sharded (FSDP): `configs/accelerate/fsdp-lora.yaml`. The main
process alone saves, evaluates and logs.

Writes `models/sft/` (model + tokenizer, `from_pretrained`-loadable), `reports/sft.json`,
`reports/sft_loss.png`; logs parameters and metrics to MLflow.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline import distributed, files, params as P, records, tracking

SCRATCH_NOTE = "from scratch"


@dataclass
class SFTParams:
    base_model: str | None = None     # local dir of a pretrained causal LM -> LoRA; None -> from scratch
    hidden_size: int = 256
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 704
    vocab_size: int = 2048
    max_length: int = 768
    pretrain_steps: int = 200
    sft_steps: int = 300
    batch_size: int = 8
    learning_rate: float = 1e-3
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    bf16: bool = False
    gradient_checkpointing: bool = False
    eval_prompts: int = 8             # validation prompts per task
    time_limit_s: float | None = None  # wall-clock budget of training (pre-training gets its share by steps,
                                       # SFT the rest)
    check_timeout_s: float = 60.0
    # processes for TRL's tokenization of the datasets (None: this one): on the GPU machine the
    # 24,747 examples + 52,287 corpus scripts took minutes of a 10-minute call in one process
    dataset_num_proc: int | None = None
    seed: int = 0
    dataset_dir: str = "data/dataset"
    output_dir: str = "models/sft"
    report: str = "reports/sft.json"
    generation: dict = field(default_factory=dict)

    def __post_init__(self):
        P.require(self.hidden_size % self.heads == 0, "hidden_size must be a multiple of heads")
        P.require(self.pretrain_steps >= 0 and self.sft_steps > 0, "sft_steps must be > 0, pretrain_steps >= 0")
        P.require(self.dataset_num_proc is None or self.dataset_num_proc >= 1,
                  "sft.dataset_num_proc must be null (one process) or >= 1")
        if self.base_model is not None:
            P.require(Path(self.base_model).is_dir(),
                      f"base_model {self.base_model!r} is not a local directory (no downloads are attempted)")


def _rows(path: Path) -> list[dict]:
    return list(files.read_jsonl(path)) if path.exists() else []


def make_tokenizer(p: SFTParams, texts: list[str]):
    if p.base_model:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(p.base_model, local_files_only=True)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    from pipeline.tokenizer import train_tokenizer

    return train_tokenizer(texts, p.vocab_size)


def make_model(p: SFTParams, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if p.base_model:
        model = AutoModelForCausalLM.from_pretrained(
            p.base_model, local_files_only=True, torch_dtype=torch.bfloat16 if p.bf16 else torch.float32)
        return model
    torch.manual_seed(p.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=p.hidden_size, num_hidden_layers=p.layers,
        num_attention_heads=p.heads, num_key_value_heads=p.heads, intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_length, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def lora_config(p: SFTParams):
    from peft import LoraConfig

    return LoraConfig(r=p.lora_r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")


def _trainer_args(p: SFTParams, out: str, steps: int, **over):
    import torch
    from trl import SFTConfig

    return SFTConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=distributed.per_device_batch(p.batch_size),
        learning_rate=p.learning_rate if not p.base_model else 2e-4, lr_scheduler_type="cosine",
        warmup_steps=min(20, steps // 10), logging_steps=max(1, steps // 50), save_strategy="no",
        report_to="none", max_length=p.max_length, seed=p.seed, bf16=p.bf16,
        gradient_checkpointing=p.gradient_checkpointing, use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0, dataset_num_proc=p.dataset_num_proc, **over)


def train(p: SFTParams, train_rows: list[dict], corpus: list[dict], progress: bool = True):
    """Returns (model, tokenizer, loss history [(phase, step, loss)], {"stopped_at": {phase: step
    where the time limit stopped it}, "runtime_s": {phase: the trainer's own training time}})."""
    from datasets import Dataset
    from trl import SFTTrainer

    from pipeline.budget import time_limit

    texts = [r["text"] for r in corpus] + [r["prompt"] + r["completion"] for r in train_rows]
    tokenizer = make_tokenizer(p, texts)
    model = make_model(p, tokenizer)
    history: list[tuple[str, int, float]] = []
    stopped: dict[str, int] = {}
    runtime: dict[str, float] = {}
    work = str(Path(p.output_dir).parent / ".sft-work")
    pretrain = p.pretrain_steps if corpus and not p.base_model else 0

    if pretrain:
        # pre-training gets its share of the budget by steps; SFT gets whatever it left
        stop = time_limit(None if p.time_limit_s is None else p.time_limit_s * pretrain / (pretrain + p.sft_steps))
        trainer = SFTTrainer(model=model, args=_trainer_args(p, work, p.pretrain_steps, disable_tqdm=not progress),
                             train_dataset=Dataset.from_list([{"text": r["text"]} for r in corpus]),
                             processing_class=tokenizer, callbacks=[stop])
        trainer.train()
        history += [("pretrain", h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
        runtime["pretrain"] = _runtime(trainer)
        if stop.stopped_at is not None:
            stopped["pretrain"] = stop.stopped_at
    data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in train_rows])
    stop = time_limit(None if p.time_limit_s is None else max(p.time_limit_s - (runtime.get("pretrain") or 0.0), 0.0))
    trainer = SFTTrainer(
        model=model, args=_trainer_args(p, work, p.sft_steps, completion_only_loss=True, disable_tqdm=not progress),
        train_dataset=data, processing_class=tokenizer, peft_config=lora_config(p) if p.base_model else None,
        callbacks=[stop])
    trainer.train()
    history += [("sft", h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    runtime["sft"] = _runtime(trainer)
    if stop.stopped_at is not None:
        stopped["sft"] = stop.stopped_at
    info = {"stopped_at": stopped, "runtime_s": runtime}
    return distributed.unsharded(trainer, str(Path(work) / "final")), tokenizer, history, info


def _runtime(trainer) -> float | None:
    return next((round(float(h["train_runtime"]), 2) for h in trainer.state.log_history if "train_runtime" in h), None)


def eval_prompts(rows: list[dict], n: int, seed: int) -> dict[str, list[dict]]:
    """Up to n distinct prompts per task from evaluation rows (one row per prompt)."""
    rng = random.Random(seed)
    out = {}
    for task in ("construction", "refinement"):
        by_prompt = {}
        for r in rows:
            if r["task"] == task:
                by_prompt.setdefault(r["prompt"], r)
        chosen = list(by_prompt.values())
        rng.shuffle(chosen)
        out[task] = chosen[:n]
    return out


def per_attempt_correctness(model, tokenizer, rows: list[dict], specs: dict[str, dict], target_spec, p: SFTParams,
                            progress: bool = True) -> dict:
    """ANCHORS.md's per-attempt correctness, with the failure breakdown by stage."""
    from tqdm import tqdm

    from pipeline.generate import GenerationParams, generate
    from pipeline.tvm_env import make_target
    from pipeline.verify import STAGES, Checker
    from pipeline.workloads import Spec, build

    g = P.from_dict(GenerationParams, p.generation, "sft.generation")
    checker = Checker(timeout_s=p.check_timeout_s, workers=g.attempts)   # a prompt's attempts built side by side
    target = make_target(target_spec)
    result = {}
    for task, chosen in eval_prompts(rows, p.eval_prompts, p.seed).items():
        counts = {s: 0 for s in STAGES}
        samples = []
        for r in tqdm(chosen, desc=f"eval {task}", disable=not progress):
            mod = build(Spec.from_json(specs[r["workload"]]))
            scripts = generate(model, tokenizer, [r["prompt"]], g, seed=p.seed, kernels=[(mod, target)]).scripts[0]
            for text, outcome in zip(scripts, checker.check_many(mod, scripts, target_spec)):
                counts[outcome.stage] += 1
                if len(samples) < 3:
                    samples.append({"script": text, **outcome.to_json()})
        attempts = sum(counts.values())
        result[task] = {"prompts": len(chosen), "attempts": attempts,
                        "correctness": counts["ok"] / attempts if attempts else None,
                        "failures_by_stage": {k: v for k, v in counts.items() if k != "ok"}, "samples": samples}
    checker.close()
    return result


def _plot(history, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    offset = 0
    for phase in ("pretrain", "sft"):
        pts = [(s, l) for ph, s, l in history if ph == phase]
        if pts:
            ax.plot([offset + s for s, _ in pts], [l for _, l in pts], label=phase)
            offset += max(s for s, _ in pts)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(params_path: str = "params.yaml", progress: bool = True) -> dict:
    import yaml

    p = P.load("sft", SFTParams, params_path)
    raw = yaml.safe_load(Path(params_path).read_text())
    data = Path(p.dataset_dir)
    train_rows, val_rows, corpus = _rows(data / "train.jsonl"), _rows(data / "val.jsonl"), _rows(data / "corpus.jsonl")
    if not train_rows:
        raise FileNotFoundError(f"no training examples in {data}: run `little-dragon data` first")
    start = time.perf_counter()
    model, tokenizer, history, info = train(p, train_rows, corpus, progress)
    train_s = time.perf_counter() - start
    if not distributed.is_main():
        return {}
    out = files.save_model_dir(model, tokenizer, p.output_dir, bf16=p.bf16)   # a fresh folder, swapped in
    n_params = sum(t.numel() for t in model.parameters())
    report = {"model": p.base_model or SCRATCH_NOTE, "parameters": n_params, "train_seconds": round(train_s, 1),
              "train_examples": len(train_rows), "corpus_scripts": len(corpus),
              "processes": distributed.world_size(), **info, "time_limit_s": p.time_limit_s,
              "final_loss": history[-1][2] if history else None, "validation": None,
              "history": [list(h) for h in history]}
    files.write_json(p.report, report)        # the training record survives an interrupted validation
    specs = records.workload_entries(raw["data"]["search_dir"])
    evaluation = per_attempt_correctness(model, tokenizer, val_rows, specs, raw["search"]["target"], p, progress)
    report["validation"] = evaluation
    files.write_json(p.report, report)
    plot = str(Path(p.report).with_name("sft_loss.png"))
    _plot(history, plot)
    metrics = {"construction_correctness": evaluation["construction"]["correctness"],
               "refinement_correctness": evaluation["refinement"]["correctness"],
               "train_seconds": train_s, "parameters": n_params}
    curves = [(f"{phase}_loss", step, loss) for phase, step, loss in history]
    report["mlflow_run_id"] = tracking.log_run("sft", asdict(p), metrics, curves, [p.report, plot])
    files.write_json(p.report, report)
    print(f"sft: {n_params/1e6:.1f}M parameters, {train_s:.0f} s training; per-attempt correctness on validation: "
          f"construction {evaluation['construction']['correctness']}, refinement {evaluation['refinement']['correctness']}"
          f" -> {out}, {p.report}")
    return report
