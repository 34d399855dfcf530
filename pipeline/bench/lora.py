"""Benchmark: LoRA training steps of an 8B-shaped model (Llama-3-8B dimensions, random
weights: no checkpoint can be downloaded), bf16 with gradient checkpointing, as the SFT
stage configures for a pretrained base. Reports peak GPU memory and tokens per second.

    python -m pipeline.bench.lora --steps 12 --batch 4 --seq 1024 --out reports/bench_lora_h200.json

This is the training step itself (PEFT LoRA on all linear layers + AdamW), timed with CUDA
synchronisation after warm-up steps; the data pipeline is not part of the figure.
"""

from __future__ import annotations

import argparse
import json
import time


def run(steps: int, batch: int, seq: int, rank: int, warmup: int = 3) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         rope_theta=500000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    init_s = time.perf_counter() - start
    n_params = sum(p.numel() for p in model.parameters())
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.05,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(warmup + steps):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t)
    times.sort()
    median = times[len(times) // 2]
    return {"model": "Llama-3-8B shape, random init, bf16", "parameters": n_params, "lora_rank": rank,
            "trainable_parameters": trainable, "batch": batch, "seq_len": seq, "gradient_checkpointing": True,
            "steps_timed": steps, "median_step_s": round(median, 4), "tokens_per_s": round(batch * seq / median, 1),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "init_s": round(init_s, 1),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "last_loss": float(loss)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--out", default="reports/bench_lora_h200.json")
    a = ap.parse_args()
    result = run(a.steps, a.batch, a.seq, a.rank)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
