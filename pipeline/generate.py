"""The generation helper shared by RL, evaluation, the registry's model and `optimize`:
kernel (+ script) -> k sampled scripts, guided by the kernel's design space by default.

- guided (default): pipeline.guided masks every step to the tokens that keep the script inside
  the kernel's design space, so each script decodes, applies and is complete by construction.
  A complete script that a postprocessor still rejects (CUDA shared memory, which the masks do
  not track) is written again, at most `retries` times per attempt; the retries are counted.
- free (`guided: false`, `optimize --free`): plain sampling, so the model's own validity
  stays visible; its figures are reported beside the guided ones.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch


@dataclass
class GenerationParams:
    attempts: int = 4
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 1024
    guided: bool = True        # design-space-guided decoding (pipeline.guided)
    retries: int = 2           # per attempt: rewrite a complete script that postprocessing rejects


@dataclass
class Written:
    """What one generation call produced, with the figures the reports need."""
    scripts: list[list[str]]              # per prompt, `attempts` scripts
    complete: list[list[bool]] = field(default_factory=list)   # guided: every decision made, EOS at the end
    tokens: int = 0                       # tokens generated (all attempts, retries included)
    seconds: float = 0.0
    retries: int = 0
    mask_seconds: float = 0.0
    token_ids: list[list[list[int]]] = field(default_factory=list)  # per prompt, per attempt (RL trains on these)


def clean(completion: str) -> str:
    """A script ends at the end-of-sequence token; anything after a blank line is dropped."""
    return completion.split("\n\n")[0].strip("\n ")


def _sample(model, tokenizer, prompt: str, n: int, g: GenerationParams, processor=None, min_new_tokens: int = 0):
    enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
    kw = dict(do_sample=True, max_new_tokens=g.max_new_tokens, num_return_sequences=n, min_new_tokens=min_new_tokens,
              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    if processor is None:
        kw.update(temperature=g.temperature, top_p=g.top_p, top_k=0)
    else:   # the processor masks first, then applies temperature and top-p itself
        processor.prompt_len = enc["input_ids"].shape[1]
        kw.update(temperature=1.0, top_p=1.0, top_k=0, logits_processor=[processor])
    seqs = model.generate(**enc, **kw)
    new = seqs[:, enc["input_ids"].shape[1]:]
    ids = []
    for row in new.tolist():
        cut = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        ids.append([t for t in row[:cut] if t != tokenizer.pad_token_id or t == tokenizer.eos_token_id])
    return ids


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], g: GenerationParams, seed: int = 0,
             kernels: list | None = None, lease=None) -> Written:
    """`g.attempts` scripts per prompt. `kernels[i]` = (mod, target) of prompt i; required
    when `g.guided`. `lease`: the device lock held around this call on a shared GPU
    (pipeline.device_lock.lease); guided decoding pauses it while it makes its masks."""
    from pipeline import guided

    torch.manual_seed(seed)
    model.eval()
    start = time.perf_counter()
    out = Written([], [], token_ids=[])
    vocab = guided.vocab_for(tokenizer) if g.guided else None
    for i, prompt in enumerate(prompts):
        if not g.guided:
            ids = _sample(model, tokenizer, prompt, g.attempts, g)
            out.tokens += sum(len(x) for x in ids)
            out.token_ids.append(ids)
            out.scripts.append([clean(tokenizer.decode(x, skip_special_tokens=True)) for x in ids])
            out.complete.append([None] * g.attempts)
            continue
        mod, target = kernels[i]
        templates = guided.make_templates(mod, target)
        scripts, complete, token_ids = [None] * g.attempts, [False] * g.attempts, [[] for _ in range(g.attempts)]
        todo = list(range(g.attempts))
        for round_ in range(g.retries + 1):
            if not todo:
                break
            cons = [guided.ScriptConstraint(mod, target, vocab, templates) for _ in todo]
            proc = guided.GuidedLogits(cons, 0, g.temperature, g.top_p, lease)
            ids = _sample(model, tokenizer, prompt, len(todo), g, proc)
            out.mask_seconds += proc.mask_seconds
            out.tokens += sum(len(x) for x in ids)
            retry = []
            for k, c, x in zip(todo, cons, ids):
                if x and x[-1] == tokenizer.eos_token_id and not c.done:
                    c.feed(x[-1])    # generation stopped at this EOS before the processor saw it
                c.close()
                text = clean(tokenizer.decode(x, skip_special_tokens=True))
                scripts[k], complete[k], token_ids[k] = text, c.complete, x
                with lease.paused() if lease is not None else contextlib.nullcontext():   # host-only work
                    rejected = c.complete and round_ < g.retries and not _postprocesses(mod, text, target)
                if rejected:
                    retry.append(k)
            out.retries += len(retry)
            todo = retry
        out.scripts.append(scripts)
        out.complete.append(complete)
        out.token_ids.append(token_ids)
    out.seconds = time.perf_counter() - start
    return out


POSTPROCESS_TIMEOUT_S = 120.0
_GUARD: list = []     # this process's Checker, whose worker runs the postprocessing check


def _decodes(mod_json: str, text: str, target_spec) -> bool:
    from pipeline import codec
    from pipeline.tvm_env import make_target, tvm

    try:
        codec.decode(tvm.ir.load_json(mod_json), text, make_target(target_spec))
        return True
    except codec.DecodeError:
        return False


def guarded(fn, *args, timeout_s: float = POSTPROCESS_TIMEOUT_S):
    """fn(*args) in a worker process with a timeout (TVM can hang or crash on a schedule),
    through the checker's worker call; None if it timed out, crashed or raised."""
    from pipeline.verify import Checker, Outcome

    if not _GUARD:
        _GUARD.append(Checker(timeout_s=timeout_s))
    out = _GUARD[0].call("postproc", fn, *args, timeout_s=timeout_s)
    return None if isinstance(out, Outcome) else out


def _postprocesses(mod, text: str, target) -> bool:
    """Whether the target's postprocessors accept a complete guided script (decode runs them),
    checked in a worker process: a TVM hang or crash on this script makes it "no"."""
    from pipeline.tvm_env import tvm

    return bool(guarded(_decodes, tvm.ir.save_json(mod), text, target.export()))
