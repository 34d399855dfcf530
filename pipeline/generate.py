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
    # Line-level constrained decoding with backtracking (generate_constrained); measured by
    # python -m pipeline.bench_constrained (reports/constrained.json).
    constrained: bool = True
    candidates: int = 8        # sampled continuations per line (one batch)
    backtracks: int = 6        # undo-and-retry budget per script


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
def _line_candidates(model, tokenizer, enc, g: GenerationParams, n: int, max_tokens: int, stop_ids: list[int]):
    """n sampled continuations up to the end of the line, as (line, ended, tokens, log-likelihood),
    distinct lines only, most likely first."""
    out = model.generate(**enc, do_sample=True, temperature=g.temperature, top_p=g.top_p, max_new_tokens=max_tokens,
                         num_return_sequences=n, pad_token_id=tokenizer.pad_token_id, eos_token_id=stop_ids,
                         output_scores=True, return_dict_in_generate=True)
    new = out.sequences[:, enc["input_ids"].shape[1]:]
    scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    seen, cands = set(), []
    for i in range(new.shape[0]):
        ids = new[i].tolist()
        keep = [t for t in ids if t != tokenizer.pad_token_id]
        text = tokenizer.decode(keep, skip_special_tokens=True)
        line = text.split("\n")[0].strip()
        ended = tokenizer.eos_token_id in keep
        if line in seen:
            continue
        seen.add(line)
        finite = scores[i][torch.isfinite(scores[i])]
        cands.append((line, ended, len(keep), float(finite.sum())))
    return sorted(cands, key=lambda c: -c[3])


def _options(model, tokenizer, context: str, g: GenerationParams, n: int, max_tokens: int, stop_ids):
    """Candidates for the next line: a batch at the sampling temperature, then (only if those
    are used up) a hotter batch for alternatives the model finds unlikely."""
    enc = tokenizer(context, return_tensors="pt", add_special_tokens=False).to(model.device)
    seen = set()
    for temperature, top_p in ((g.temperature, g.top_p), (1.25 * g.temperature, 1.0)):
        hot = GenerationParams(g.attempts, temperature, top_p, g.max_new_tokens, g.constrained, n, 0)
        for cand in _line_candidates(model, tokenizer, enc, hot, n, max_tokens, stop_ids):
            if not cand[0] and temperature != g.temperature:
                continue    # ending the script is the model's call, not the hot batch's
            if cand[0] not in seen:
                seen.add(cand[0])
                yield cand


@torch.no_grad()
def generate_constrained(model, tokenizer, prompt: str, g: GenerationParams, mod, target,
                         max_lines: int = 200, seed: int = 0) -> list[str]:
    """Line-level constrained sampling with backtracking (beyond the paper).

    For each line, `g.candidates` continuations are sampled in one batch and tried most likely
    first; a line is kept only if the script so far still decodes and applies (names defined,
    tile products, categorical ranges). When no candidate fits, the previous line is undone and
    its next candidate tried (a valid prefix can still lead nowhere, e.g. a skipped block),
    at most `g.backtracks` times per script. The model ends a script with an empty line or
    the end-of-sequence token; a script that runs out of options ends where it is (valid).
    One script per attempt."""
    torch.manual_seed(seed)
    model.eval()
    stop_ids = [tokenizer.eos_token_id] + [i for t, i in tokenizer.get_vocab().items() if "\u010a" in t or "\n" in t]
    scripts = []
    for _ in range(g.attempts):
        lines: list[str] = []
        options: list = []          # per depth: an iterator over that prefix's candidates
        used: list[int] = []        # tokens of each accepted line
        backtracks = 0
        best: list[str] = []         # the longest valid prefix met, if the search runs dry
        ran_dry = False
        while len(lines) < max_lines and sum(used) < g.max_new_tokens:
            if len(options) == len(lines):
                context = prompt + "".join(line + "\n" for line in lines)
                options.append(_options(model, tokenizer, context, g, g.candidates,
                                        min(48, g.max_new_tokens - sum(used)), stop_ids))
            chosen = None
            for line, ended, n_tokens, _ in options[-1]:
                if not line:
                    if lines:
                        chosen = ("", True, 0)
                        break
                    continue
                if _valid_prefix(mod, target, lines + [line]):
                    chosen = (line, ended, n_tokens)
                    break
            if len(lines) > len(best):
                best = list(lines)
            if chosen is None:
                if lines and backtracks < g.backtracks:
                    options.pop()
                    lines.pop()
                    used.pop()
                    backtracks += 1
                    continue
                ran_dry = True
                break
            line, ended, n_tokens = chosen
            if not line:
                break
            lines.append(line)
            used.append(n_tokens)
            if ended:
                break
        scripts.append("\n".join(best if ran_dry and len(best) > len(lines) else lines))
    return scripts
