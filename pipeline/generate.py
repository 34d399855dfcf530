"""The generation helper shared by RL, evaluation and the command line:
kernel (+ script) -> k sampled scripts, with temperature and top-p from params.yaml."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GenerationParams:
    attempts: int = 4
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 384


def clean(completion: str) -> str:
    """A script ends at the end-of-sequence token; anything after a blank line is dropped."""
    return completion.split("\n\n")[0].strip("\n ")


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], g: GenerationParams, seed: int = 0) -> list[list[str]]:
    """For each prompt, `g.attempts` sampled scripts."""
    torch.manual_seed(seed)
    model.eval()
    out: list[list[str]] = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        seqs = model.generate(
            **enc, do_sample=True, temperature=g.temperature, top_p=g.top_p, max_new_tokens=g.max_new_tokens,
            num_return_sequences=g.attempts, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out.append([clean(t) for t in texts])
    return out
