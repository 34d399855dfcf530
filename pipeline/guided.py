"""Guided decoding: the model writes only scripts of the kernel's design space.

A script of the design space is a sketch's text with one hole per sampling decision
(pipeline.sketch). Between holes the text is forced (mnemonics, references, block names,
counts); in a hole, any encoding of an allowed decision. At every step the logits are masked
to the tokens that keep the text a prefix of some valid script: a depth-first walk of the
tokenizer's vocabulary (as a character trie) against the script automaton, so it works with
any tokenizer, ours or an 8B base's (prior art: xgrammar/outlines token tries; the semantic
part, i.e. which decisions are allowed, comes from the replayed schedule, which no grammar
library has). A token may finish a decision and run on into the forced text after it, so the
model keeps its own tokenization; it may not run into the next decision, whose domain depends
on this one. The end-of-sequence token is allowed only when the script is complete.

Several sketches are followed at once until the text tells them apart: the model's choice of
sketch is made by the same masking. When the text passes a decision, it is applied to that
sketch's live schedule (sketch.Walk), which yields the next decision's domain.

    constraint = ScriptConstraint(mod, target, vocab)      # one per script being written
    processor = GuidedLogits([constraint, ...], prompt_len, temperature, top_p)
    model.generate(..., logits_processor=[processor], do_sample=True, temperature=1, top_p=1, top_k=0)
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch

from pipeline import codec
from pipeline.sketch import SAMPLING, Walk, WalkFailed, sketches, thread_roles_of

# ---------------------------------------------------------------------------------------
# Sketch -> pieces of text: forced strings and decision holes
# ---------------------------------------------------------------------------------------


@dataclass
class Hole:
    kind: str               # the sampling instruction kind
    fmt: str                # "ints" (tile factors) or "int"


def _hole(inst: list, decision) -> tuple[str, Hole, str]:
    """(text before, hole, text after) of a sampling instruction's line."""
    kind = inst[0]
    form = codec.FORMS[kind]
    line = codec._encode_inst(inst, decision)
    toks = line.split(" ")
    pos = 1 + next(k for k, f in enumerate(form.fields) if f[0] == "dec")
    fmt = next(f[2] for f in form.fields if f[0] == "dec")
    if line.startswith("!") or len(toks) <= pos or toks[pos] != format_value(fmt, decision):
        raise ValueError(f"no short form with a decision field for {kind}")
    before = " ".join(toks[:pos]) + " "
    after = (" " + " ".join(toks[pos + 1:])) if len(toks) > pos + 1 else ""
    return before, Hole(kind, fmt), after


def format_value(fmt: str, value) -> str:
    return ",".join(str(int(x)) for x in value) if fmt == "ints" else str(int(value))


def pieces_of(sketch) -> list:
    """[str, Hole, str, Hole, ..., str]: the script text of `sketch` with its decisions as holes.
    Sampling kinds without a domain (none in the default spaces) stay as forced text."""
    insts, decisions = codec.trace_to_json(sketch)
    by_index = {int(i): d for i, d in decisions}
    out: list = [""]
    for i, inst in enumerate(insts):
        sep = "\n" if i else ""
        if inst[0] in SAMPLING:
            before, hole, after = _hole(inst, by_index[i])
            out[-1] += sep + before
            out += [hole, after]
        else:
            out[-1] += sep + codec._encode_inst(inst, by_index.get(i))
    return out


# ---------------------------------------------------------------------------------------
# Vocabulary as a character trie
# ---------------------------------------------------------------------------------------

class Vocab:
    """The tokenizer's tokens as strings, in a character trie: node = (children, token ids)."""

    def __init__(self, tokenizer):
        self.eos = tokenizer.eos_token_id
        special = set(tokenizer.all_special_ids)
        self.size = len(tokenizer)
        self.root: dict = {}
        self.strings: dict[int, str] = {}
        self.longest = 1
        anchor = tokenizer.encode("B", add_special_tokens=False)
        base = tokenizer.decode(anchor, clean_up_tokenization_spaces=False)
        for i in range(self.size):
            if i in special:
                continue
            # decode after an anchor token: sentencepiece tokenizers drop a leading space when
            # a token is decoded alone
            s = tokenizer.decode(anchor + [i], clean_up_tokenization_spaces=False)
            s = s[len(base):] if s.startswith(base) else tokenizer.decode([i], clean_up_tokenization_spaces=False)
            if not s or "\ufffd" in s:
                continue
            self.strings[i] = s
            self.longest = max(self.longest, len(s))
            node = self.root
            for ch in s:
                node = node.setdefault(ch, {})
            node.setdefault(None, []).append(i)


_VOCABS: dict[int, Vocab] = {}


def vocab_for(tokenizer) -> Vocab:
    key = id(tokenizer)
    if key not in _VOCABS:
        _VOCABS[key] = Vocab(tokenizer)
    return _VOCABS[key]


# ---------------------------------------------------------------------------------------
# The script automaton
# ---------------------------------------------------------------------------------------

@dataclass
class _Branch:
    """One sketch being followed: its pieces, live walk, the current decision's domain."""
    pieces: list
    walk: Walk
    piece: int = 0                 # index into pieces
    pos: object = 0                # int offset in a forced piece, or the value prefix in a hole
    hole: int = -1                 # the hole whose domain is loaded (-1: no hole left)
    values: dict = field(default_factory=dict)     # value text -> decision, for that hole
    prefixes: set = field(default_factory=set)     # every prefix of a value text

    def load_next(self) -> None:
        """Run the walk to the next hole at or after `piece` and load its domain; with no hole
        left, run the rest of the sketch (WalkFailed if it does not apply)."""
        self.hole = next((k for k in range(self.piece, len(self.pieces)) if isinstance(self.pieces[k], Hole)), -1)
        choice = self.walk.next()
        if self.hole < 0:
            self.values, self.prefixes = {}, set()
            if choice is not None:
                raise WalkFailed("the walk has a decision the text has no hole for")
            return
        hole = self.pieces[self.hole]
        if choice is None or choice.kind != hole.kind:
            raise WalkFailed("the sketch and its walk disagree")
        self.values = {format_value(hole.fmt, v): v for v in choice.values}
        self.prefixes = {t[:k] for t in self.values for k in range(len(t) + 1)}
        if not self.values:
            raise WalkFailed(f"no valid decision for {choice.kind}")


def _step(b: _Branch, piece: int, pos, ch: str):
    """Advance (piece, pos) of branch b by one character, or None. Commits nothing: only the
    loaded hole's domain is known, so the text may not enter a later hole."""
    pieces = b.pieces
    while True:
        p = pieces[piece]
        if isinstance(p, Hole):
            if piece != b.hole:
                return None
            prefix = pos if isinstance(pos, str) else ""
            if prefix + ch in b.prefixes:
                return piece, prefix + ch
            if prefix in b.values:          # the value is complete: continue into the text after
                piece, pos = piece + 1, 0
                continue
            return None
        if pos < len(p):
            return (piece, pos + 1) if p[pos] == ch else None
        if piece + 1 >= len(pieces):
            return None
        piece, pos = piece + 1, ""


def _at_end(b: _Branch, piece: int, pos) -> bool:
    pieces = b.pieces
    while True:
        p = pieces[piece]
        if isinstance(p, Hole):
            if piece != b.hole or not (isinstance(pos, str) and pos in b.values):
                return False
            piece, pos = piece + 1, 0
            continue
        if pos < len(p):
            return False
        if piece + 1 >= len(pieces):
            return True
        piece, pos = piece + 1, ""


class ScriptConstraint:
    """The set of valid continuations of one script being written for `mod` on `target`."""

    def __init__(self, mod, target, vocab: Vocab, templates: list | None = None):
        self.vocab = vocab
        self.text = ""
        self.branches: list[_Branch] = []
        self.done = False
        for sketch, pieces, roles in (templates if templates is not None else make_templates(mod, target)):
            b = _Branch(pieces, Walk(mod, target, sketch, roles))
            try:
                b.load_next()
            except WalkFailed:
                b.walk.close()
                continue
            self.branches.append(b)
        if not self.branches:
            raise WalkFailed("no sketch of the design space applies to this kernel")

    # -- masking ----------------------------------------------------------------------
    def allowed(self) -> list[int]:
        """Token ids that keep the text a prefix of a valid script (EOS when complete)."""
        out: list[int] = []
        states = [(b, b.piece, b.pos) for b in self.branches]
        # Fast path through forced text: every branch must read the same characters next, so
        # the vocabulary trie is followed along them alone (one path, not every first character).
        node = self.vocab.root
        for ch in self._forced_ahead(states):
            node = node.get(ch)
            if node is None:
                break
            states = [(b, *_step(b, piece, pos, ch)) for b, piece, pos in states]
            out.extend(node.get(None, ()))
        else:
            self._dfs(node, states, out)
        if any(_at_end(b, b.piece, b.pos) for b in self.branches):
            out.append(self.vocab.eos)
        return out

    def _forced_ahead(self, states: list) -> str:
        """The text every branch must read next (up to the vocabulary's longest token): the
        common prefix of their forced pieces; empty as soon as one is inside a hole."""
        common = None
        for b, piece, pos in states:
            p = b.pieces[piece]
            if isinstance(p, Hole) or not isinstance(pos, int):
                return ""
            rest = p[pos:pos + self.vocab.longest]
            if common is None:
                common = rest
            else:
                k = 0
                while k < min(len(common), len(rest)) and common[k] == rest[k]:
                    k += 1
                common = common[:k]
            if not common:
                return ""
        return common or ""

    def _dfs(self, node: dict, states: list, out: list) -> None:
        for ch, child in node.items():
            if ch is None:
                continue
            nxt = []
            for b, piece, pos in states:
                r = _step(b, piece, pos, ch)
                if r is not None:
                    nxt.append((b, r[0], r[1]))
            if nxt:
                out.extend(child.get(None, ()))
                self._dfs(child, nxt, out)

    # -- committing -------------------------------------------------------------------
    def feed(self, token_id: int) -> None:
        """Append a sampled token: advance every branch, apply decisions the text completed."""
        if token_id == self.vocab.eos:
            self.done = True
            ended = []
            for b in self.branches:
                try:
                    if _at_end(b, b.piece, b.pos):
                        self._finish_value(b)
                        ended.append(b)
                        continue
                except WalkFailed:
                    pass
                b.walk.close()
            self.branches = ended
            return
        self.feed_text(self.vocab.strings[token_id])

    def feed_text(self, s: str) -> None:
        """Append text (any split into tokens gives the same state)."""
        self.text += s
        alive = []
        for b in self.branches:
            ok = True
            for ch in s:
                r = _step(b, b.piece, b.pos, ch)
                if r is None:
                    ok = False
                    break
                passed = b.hole >= 0 and r[0] > b.hole     # the text left a hole: apply its value
                value = b.pos if passed else None
                b.piece, b.pos = r
                if passed:
                    try:
                        b.walk.decide(b.values[value])
                        b.load_next()
                    except WalkFailed:
                        ok = False
                        break
            if ok:
                alive.append(b)
            else:
                b.walk.close()
        self.branches = alive

    def _finish_value(self, b: _Branch) -> None:
        """At EOS a script may end in a decision (its last line): apply it."""
        if b.hole >= 0 and b.piece == b.hole and isinstance(b.pos, str) and b.pos in b.values:
            b.walk.decide(b.values[b.pos])
            b.piece, b.pos = b.hole + 1, 0
            b.load_next()

    def close(self) -> None:
        for b in self.branches:
            b.walk.close()

    @property
    def complete(self) -> bool:
        return self.done and bool(self.branches)


def in_space(mod, target, text: str, templates: list | None = None) -> bool:
    """Whether the guided decoder can write `text` for this kernel (the share of the training
    data inside the design space is measured with this)."""
    try:
        c = ScriptConstraint(mod, target, _NO_VOCAB, templates)
    except WalkFailed:
        return False
    try:
        c.feed_text(text)
        if not c.branches or not any(_at_end(b, b.piece, b.pos) for b in c.branches):
            return False
        c.feed(_NO_VOCAB.eos)
        return c.complete
    finally:
        c.close()


class _TextOnly:
    """A stand-in vocabulary for checking text (no tokenizer involved)."""
    eos = -1
    strings: dict = {}


_NO_VOCAB = _TextOnly()


def make_templates(mod, target) -> list:
    """(sketch, pieces, thread roles) for each sketch of the design space: computed once per
    kernel and shared by every script written for it."""
    out = []
    for sk in sketches(mod, target):
        try:
            out.append((sk, pieces_of(sk), thread_roles_of(sk)))
        except (ValueError, StopIteration):
            continue
    return out


# ---------------------------------------------------------------------------------------
# The logits processor (transformers' generate, TRL rollouts)
# ---------------------------------------------------------------------------------------

class GuidedLogits:
    """Masks each row's logits to its constraint's allowed tokens, then applies temperature and
    top-p *after* masking (so top-p never removes every valid token). Use with generate's own
    warpers off: do_sample=True, temperature=1.0, top_p=1.0, top_k=0."""

    def __init__(self, constraints: list[ScriptConstraint], prompt_len: int, temperature: float = 1.0,
                 top_p: float = 1.0, lease=None):
        self.constraints, self.prompt_len = constraints, prompt_len
        self.temperature, self.top_p = temperature, top_p
        self.mask_seconds = 0.0
        # a pipeline.device_lock.Lease held around generation on a shared GPU: released while
        # the masks are made on the host, so other processes' timings can run between two steps
        self.lease = lease

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        start = time.perf_counter()
        # The mask is made on the host and sent once: on a GPU, per-row reads of the last token
        # and per-row index tensors cost a device sync and several kernel launches each.
        last = input_ids[:, -1].tolist() if input_ids.shape[1] > self.prompt_len else None
        allow = torch.zeros(scores.shape, dtype=torch.bool)
        ended = []
        with self.lease.paused() if self.lease is not None else contextlib.nullcontext():
            for row, c in enumerate(self.constraints):
                if last is not None and not c.done:
                    c.feed(last[row])
                ids = c.allowed() if not c.done and c.branches else []
                if not ids:          # finished, dead, or no continuation (then incomplete): only EOS follows
                    c.done = True
                    ended.append(row)
                    allow[row, c.vocab.eos] = True
                    continue
                allow[row, ids] = True
        allow = allow.to(scores.device, non_blocking=True)
        masked = torch.where(allow, scores / max(self.temperature, 1e-5), -math.inf)
        if ended:            # their only allowed token, EOS, gets logit 0
            masked[ended, [self.constraints[r].vocab.eos for r in ended]] = 0.0
        if self.top_p < 1.0:
            masked = _top_p(masked, self.top_p)
        self.mask_seconds += time.perf_counter() - start
        return masked


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(dim=-1)
    cum = probs.cumsum(dim=-1)
    remove = cum - probs > top_p           # keep at least the most likely token
    sorted_logits = sorted_logits.masked_fill(remove, -math.inf)
    return torch.full_like(logits, -math.inf).scatter(-1, order, sorted_logits)
