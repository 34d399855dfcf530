"""The generation helper shared by RL, evaluation, the registry's model and `optimize`:
kernel (+ script) -> k sampled scripts, guided by the kernel's design space by default.

- guided (default): pipeline.guided masks every step to the tokens that keep the script inside
  the kernel's design space, so each script decodes, applies and is complete by construction.
  A complete script that a postprocessor still rejects (CUDA shared memory, which the masks do
  not track) is written again, at most `retries` times per attempt; the retries are counted.
  A rejected attempt's rewrites are sampled `retry_rows` at a time and the first that passes is
  kept (what writing them one after another gives, in fewer decoding passes).
- free (`guided: false`, `optimize --free`): plain sampling, so the model's own validity
  stays visible; its figures are reported beside the guided ones.
"""

from __future__ import annotations

import contextlib
import os
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
    batch_rows: int = 64       # (prompt, attempt) rows sampled together in one batch
    retry_rows: int = 4        # rewrites of a rejected attempt sampled at once (the first that passes is kept)

    def __post_init__(self):
        from pipeline import params as P

        P.require(self.attempts >= 1, "generation.attempts must be >= 1")
        P.require(self.max_new_tokens >= 1, "generation.max_new_tokens must be >= 1")
        P.require(self.retries >= 0, "generation.retries must be >= 0")
        P.require(self.batch_rows >= 1, "generation.batch_rows must be >= 1 (rows sampled together)")
        P.require(self.retry_rows >= 1, "generation.retry_rows must be >= 1 (rewrites sampled at once)")


# How rows are grouped into batches, not what is sampled: results kept under other values still count
GROUPING = ("batch_rows", "retry_rows")


def sampling_key(g: GenerationParams) -> dict:
    """The settings that decide what a generation samples (a kept result's key)."""
    from dataclasses import asdict

    return {k: v for k, v in asdict(g).items() if k not in GROUPING}


@dataclass
class Written:
    """What one generation call produced, with the figures the reports need."""
    scripts: list[list[str]]              # per prompt, `attempts` scripts
    complete: list[list[bool]] = field(default_factory=list)   # guided: every decision made, EOS at the end
    tokens: int = 0                       # tokens generated (all attempts, retries included)
    seconds: float = 0.0
    retries: int = 0
    mask_seconds: float = 0.0             # guided: making the masks on the host (inside sampling)
    postprocess_seconds: float = 0.0      # guided with retries: checking complete scripts on the host
    token_ids: list[list[list[int]]] = field(default_factory=list)  # per prompt, per attempt (RL trains on these)
    prompt_tokens: list[int] = field(default_factory=list)   # per prompt: tokens generated, retries included
    prompt_retries: list[int] = field(default_factory=list)  # per prompt: scripts written again


def clean(completion: str) -> str:
    """A script ends at the end-of-sequence token; anything after a blank line is dropped."""
    return completion.split("\n\n")[0].strip("\n ")


def _sample(model, tokenizer, rows: list[str], g: GenerationParams, processor=None, min_new_tokens: int = 0):
    """One sampled continuation per row (rows may repeat a prompt), left-padded into one batch."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"      # decoder-only: every row's last prompt token at the same column
    try:
        enc = tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    finally:
        tokenizer.padding_side = side
    kw = dict(do_sample=True, max_new_tokens=g.max_new_tokens, min_new_tokens=min_new_tokens,
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


def _chunks(rows: list, size: int) -> list[list]:
    return [rows[i:i + size] for i in range(0, len(rows), max(1, size))]


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], g: GenerationParams, seed: int = 0,
             kernels: list | None = None, lease=None) -> Written:
    """`g.attempts` scripts per prompt, every (prompt, attempt) a row of one batched generation
    (at most `g.batch_rows` rows a batch: an evaluation writes for many kernels at once).
    `kernels[i]` = (mod, target) of prompt i; required when `g.guided`. `lease`: the device
    lock held around this call on a shared GPU (pipeline.device_lock.lease); guided decoding
    pauses it while it makes its masks and checks rewrites on the host."""
    from pipeline import guided

    torch.manual_seed(seed)
    model.eval()
    start = time.perf_counter()
    n = len(prompts)
    out = Written([[None] * g.attempts for _ in range(n)], [[None] * g.attempts for _ in range(n)],
                  token_ids=[[[] for _ in range(g.attempts)] for _ in range(n)], prompt_tokens=[0] * n,
                  prompt_retries=[0] * n)
    rows = [(i, k) for i in range(n) for k in range(g.attempts)]
    if not g.guided:
        for chunk in _chunks(rows, g.batch_rows):
            for (i, k), x in zip(chunk, _sample(model, tokenizer, [prompts[i] for i, _ in chunk], g)):
                out.tokens += len(x)
                out.prompt_tokens[i] += len(x)
                out.token_ids[i][k] = x
                out.scripts[i][k] = clean(tokenizer.decode(x, skip_special_tokens=True))
        out.seconds = time.perf_counter() - start
        return out
    vocab = guided.vocab_for(tokenizer)
    templates: dict[int, list] = {}      # per kernel, shared by its prompts (construction + refinements)
    for i in range(n):
        mod, target = kernels[i]
        if id(mod) not in templates:
            templates[id(mod)] = guided.make_templates(mod, target)
    out.complete = [[False] * g.attempts for _ in range(n)]
    left = {row: g.retries for row in rows}      # rewrites each (prompt, attempt) may still take
    todo = [(row, 1, False) for row in rows]     # (row, copies to sample this round, are they rewrites)
    while todo:
        # a rejected attempt's next rewrites are sampled side by side (`retry_rows` of them) and the
        # first that passes is kept, as if they had been written one after another: on a GPU a
        # decoding step costs about the same for 4 rows as for 1, a round of rewrites a whole pass
        copies = [(row, j, rewrite) for row, m, rewrite in todo for j in range(m)]
        last = {row: j for row, j, _ in copies}   # the row's last copy this round
        kernel_of = [kernels[i] for (i, _), _, _ in copies]   # (mod, target) of each copy
        written = []                              # per copy: (constraint, token ids, text)
        for chunk in _chunks(copies, g.batch_rows):
            cons = [guided.ScriptConstraint(*kernels[i], vocab, templates[id(kernels[i][0])]) for (i, _), _, _ in chunk]
            proc = guided.GuidedLogits(cons, 0, g.temperature, g.top_p, lease)
            ids = _sample(model, tokenizer, [prompts[i] for (i, _), _, _ in chunk], g, proc)
            out.mask_seconds += proc.mask_seconds
            for ((i, _), _, _), c, x in zip(chunk, cons, ids):
                out.tokens += len(x)
                out.prompt_tokens[i] += len(x)
                if x and x[-1] == tokenizer.eos_token_id and not c.done:
                    c.feed(x[-1])    # generation stopped at this EOS before the processor saw it
                c.close()
                written.append((c, x, clean(tokenizer.decode(x, skip_special_tokens=True))))
        # after a copy, the rewrites its row would have left: only then is it worth checking
        after = [left[row] - (j + 1 if rewrite else 0) for row, j, rewrite in copies]
        check = [q for q, (c, _, _) in enumerate(written) if c.complete and after[q] > 0]
        passed: dict[int, bool] = {}
        if check:
            pp_start = time.perf_counter()
            with lease.paused() if lease is not None else contextlib.nullcontext():   # host-only work
                ok = _postprocess_many([(kernel_of[q][0], written[q][2], kernel_of[q][1]) for q in check])
            out.postprocess_seconds += time.perf_counter() - pp_start
            passed = dict(zip(check, ok))
        todo, done = [], set()
        for q, ((i, k), j, rewrite) in enumerate(copies):
            if (i, k) in done:
                continue             # an earlier copy of this row was kept
            c, x, text = written[q]
            out.scripts[i][k], out.complete[i][k], out.token_ids[i][k] = text, c.complete, x
            if rewrite:
                out.retries += 1
                out.prompt_retries[i] += 1
            if not c.complete or after[q] <= 0 or passed.get(q, False):
                done.add((i, k))     # kept: incomplete, out of rewrites, or accepted
            elif j == last[(i, k)]:  # every copy rejected: more rewrites next round
                left[(i, k)] = after[q]
                todo.append(((i, k), min(g.retry_rows, after[q]), True))
    out.seconds = time.perf_counter() - start
    return out


POSTPROCESS_TIMEOUT_S = 120.0
_GUARD: list = []     # this process's Checker, whose workers run the postprocessing checks


def _decodes(mod_json: str, text: str, target_spec) -> bool:
    from pipeline import codec
    from pipeline.tvm_env import make_target, tvm

    try:
        codec.decode(tvm.ir.load_json(mod_json), text, make_target(target_spec))
        return True
    except codec.DecodeError:
        return False


def _guard():
    from pipeline.verify import Checker

    if not _GUARD:     # a batch's rewrites are checked side by side, on up to half the cores
        _GUARD.append(Checker(timeout_s=POSTPROCESS_TIMEOUT_S, workers=max(1, min(8, (os.cpu_count() or 2) // 2))))
    return _GUARD[0]


def guarded(fn, *args, timeout_s: float = POSTPROCESS_TIMEOUT_S):
    """fn(*args) in a worker process with a timeout (TVM can hang or crash on a schedule),
    through the checker's worker call; None if it timed out, crashed or raised."""
    from pipeline.verify import Outcome

    out = _guard().call("postproc", fn, *args, timeout_s=timeout_s)
    return None if isinstance(out, Outcome) else out


def _postprocess_many(items: list[tuple]) -> list[bool]:
    """Whether the target's postprocessors accept each complete guided script (mod, text,
    target) (decode runs them), checked side by side in worker processes: a TVM hang or crash
    on a script makes it "no"."""
    from pipeline.tvm_env import tvm
    from pipeline.verify import Outcome

    mods = {id(mod): mod for mod, _, _ in items}
    saved = {key: tvm.ir.save_json(mod) for key, mod in mods.items()}
    jobs = [(saved[id(mod)], text, target.export()) for mod, text, target in items]
    outs = _guard().call_many("postproc", _decodes, jobs, timeout_s=POSTPROCESS_TIMEOUT_S)
    return [not isinstance(o, Outcome) and bool(o) for o in outs]
