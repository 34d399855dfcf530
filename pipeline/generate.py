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
    # Line-level constrained decoding (generate_constrained). Measured with the CPU SFT model
    # (python -m pipeline.bench_constrained): per-attempt correctness 0/16 free -> 16/16.
    constrained: bool = True


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


def _valid_prefix(mod, target, lines: list[str]) -> bool:
    """The script so far parses, references only defined names, keeps categorical indices in
    range, and applies with tile factors that multiply to the loop extents (no postprocessing)."""
    from pipeline import codec

    try:
        codec.decode(mod, "\n".join(lines + ["NOPOST"]), target)
        return True
    except codec.DecodeError:
        return False


@torch.no_grad()
def generate_constrained(model, tokenizer, prompt: str, g: GenerationParams, mod, target,
                         retries: int = 8, max_lines: int = 200, seed: int = 0) -> list[str]:
    """Line-level constrained sampling (beyond the paper): each sampled line is kept only if
    the script so far still decodes and applies (names defined, tile products, categorical
    ranges); otherwise the line is resampled, up to `retries` times. One script per attempt."""
    torch.manual_seed(seed)
    model.eval()
    newline_ids = [i for t, i in tokenizer.get_vocab().items() if "\u010a" in t or "\n" in t]
    scripts = []
    for _ in range(g.attempts):
        lines: list[str] = []
        budget = g.max_new_tokens
        while budget > 0 and len(lines) < max_lines:
            context = prompt + "".join(line + "\n" for line in lines)
            enc = tokenizer(context, return_tensors="pt", add_special_tokens=False).to(model.device)
            accepted, finished = None, False
            for _ in range(retries):
                seq = model.generate(**enc, do_sample=True, temperature=g.temperature, top_p=g.top_p,
                                     max_new_tokens=min(48, budget), pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=[tokenizer.eos_token_id, *newline_ids])
                new = seq[0, enc["input_ids"].shape[1]:]
                text = tokenizer.decode(new, skip_special_tokens=True)
                ended = tokenizer.eos_token_id in new.tolist()
                line = text.split("\n")[0].strip()
                if not line:
                    finished = ended or bool(lines)
                    if finished:
                        break
                    continue
                if _valid_prefix(mod, target, lines + [line]):
                    accepted, finished = line, ended
                    budget -= len(new)
                    break
            if accepted is None:
                break
            lines.append(accepted)
            if finished:
                break
        scripts.append("\n".join(lines))
    return scripts
