"""SFT: a tiny from-scratch model and a tiny 'pretrained' base with LoRA, trained for real."""

import dataclasses

import pytest
import torch

from pipeline.stages import sft as train_sft
from pipeline.generate import GenerationParams, clean, generate
from pipeline.params import ParamsError, from_dict

ROWS = [{"prompt": f"target: llvm\nargs: A f32[{n},64]\n### script\n",
         "completion": f"B matmul\nL b0 3\nT l1 1,{n}\nS l1 v4-5"} for n in (2, 4, 8, 16)] * 8
CORPUS = [{"text": r["prompt"] + r["completion"]} for r in ROWS]


def _params(tmp_path, **over):
    values = dict(hidden_size=32, layers=2, heads=2, intermediate_size=64, vocab_size=300, max_length=128,
                  pretrain_steps=5, sft_steps=30, batch_size=8, learning_rate=3e-3,
                  output_dir=str(tmp_path / "sft"), report=str(tmp_path / "sft.json"))
    values.update(over)
    return from_dict(train_sft.SFTParams, values)


def test_scratch_model_learns_and_weights_change(tmp_path):
    p = _params(tmp_path)
    torch.manual_seed(0)
    tokenizer = train_sft.make_tokenizer(p, [r["text"] for r in CORPUS])
    before = {k: v.clone() for k, v in train_sft.make_model(p, tokenizer).state_dict().items()}
    model, tokenizer, history, _ = train_sft.train(p, ROWS, CORPUS, progress=False)
    sft = [loss for phase, _, loss in history if phase == "sft"]
    assert sft[-1] < sft[0] * 0.7, sft
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # It saves and loads like any Hugging Face model.
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    outs = generate(loaded, tok, [ROWS[0]["prompt"]], GenerationParams(attempts=2, max_new_tokens=24, guided=False)).scripts
    assert len(outs) == 1 and len(outs[0]) == 2 and all(isinstance(t, str) for t in outs[0])


def test_lora_on_a_local_pretrained_base(tmp_path):
    """The pretrained path: a local directory (made here, as no hub is reachable), LoRA adapters."""
    from transformers import LlamaConfig, LlamaForCausalLM

    scratch = _params(tmp_path)
    tokenizer = train_sft.make_tokenizer(scratch, [r["text"] for r in CORPUS])
    base_dir = tmp_path / "base"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=128,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    p = _params(tmp_path, base_model=str(base_dir), sft_steps=20)
    model, tok, history, _ = train_sft.train(p, ROWS, CORPUS, progress=False)
    assert [ph for ph, _, _ in history if ph == "pretrain"] == []  # no corpus pre-training for a pretrained base
    trainable = [n for n, t in model.named_parameters() if t.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    sft = [loss for phase, _, loss in history if phase == "sft"]
    assert sft[-1] < sft[0]


def test_missing_base_model_directory_is_rejected(tmp_path):
    with pytest.raises(ParamsError, match="not a local directory"):
        _params(tmp_path, base_model=str(tmp_path / "nope"))


def test_guided_generation_of_a_barely_trained_model_is_valid_and_complete(tmp_path, matmul_mod, cpu_target):
    """Whatever a barely trained model prefers, guided decoding writes complete scripts that
    decode, apply and postprocess; the same model sampling freely does not."""
    from pipeline.codec import DecodeError, decode
    from pipeline.generate import generate

    p = _params(tmp_path, sft_steps=10, pretrain_steps=0)
    model, tok, _, _ = train_sft.train(p, ROWS, CORPUS, progress=False)
    g = GenerationParams(attempts=3, max_new_tokens=600)
    w = generate(model, tok, [ROWS[0]["prompt"]], g, kernels=[(matmul_mod, cpu_target)])
    assert w.complete == [[True, True, True]] and w.tokens > 0
    for text in w.scripts[0]:
        decode(matmul_mod, text, cpu_target)  # raises DecodeError if it were not valid
    free = generate(model, tok, [ROWS[0]["prompt"]], GenerationParams(attempts=3, max_new_tokens=600, guided=False))
    bad = 0
    for text in free.scripts[0]:
        try:
            decode(matmul_mod, text, cpu_target)
        except DecodeError:
            bad += 1
    assert bad >= 1   # 10 steps teach little: the model's own scripts are mostly invalid


def test_several_kernels_prompts_are_written_in_one_batch(tmp_path, matmul_mod, cpu_target):
    """An evaluation writes for many kernels at once: prompts of different kernels (and lengths)
    share left-padded batches of `batch_rows` rows, and every row is a complete, valid script
    of its own kernel; the per-prompt token counts add up to the total."""
    from pipeline.codec import decode
    from pipeline.describe import describe
    from pipeline.prompts import construction_prompt
    from pipeline.workloads import Spec, build

    other = build(Spec("softmax", (8, 48), "float32"))
    prompts = [ROWS[0]["prompt"], construction_prompt(describe(other), "llvm")]
    p = _params(tmp_path, sft_steps=10, pretrain_steps=0)
    model, tok, _, _ = train_sft.train(p, ROWS, CORPUS, progress=False)
    g = GenerationParams(attempts=3, max_new_tokens=600, batch_rows=4)    # 6 rows: batches of 4 and 2
    side = tok.padding_side
    w = generate(model, tok, prompts, g, kernels=[(matmul_mod, cpu_target), (other, cpu_target)])
    assert w.complete == [[True] * 3, [True] * 3]
    assert sum(w.prompt_tokens) == w.tokens > 0 and all(w.prompt_tokens)
    assert 0 < w.mask_seconds < w.seconds and 0 < w.postprocess_seconds < w.seconds   # where the time went
    for mod, scripts in zip((matmul_mod, other), w.scripts):
        for text in scripts:
            decode(mod, text, cpu_target)      # raises DecodeError if it were not this kernel's script
    assert tok.padding_side == side            # the batch's left padding does not leak into the tokenizer
    with pytest.raises(ParamsError, match="batch_rows"):
        GenerationParams(batch_rows=0)


def test_rejected_attempts_are_rewritten_several_at_a_time(tmp_path, matmul_mod, cpu_target, monkeypatch):
    """A complete script that postprocessing rejects is written again, its rewrites sampled
    `retry_rows` at a time, the first that passes kept: the rewrites counted are those writing
    them one after another takes, in fewer decoding passes; out of rewrites, the last is kept."""
    from pipeline import generate as G

    p = _params(tmp_path, sft_steps=10, pretrain_steps=0)
    model, tok, _, _ = train_sft.train(p, ROWS, CORPUS, progress=False)
    real_sample, passes, verdicts = G._sample, [], []
    monkeypatch.setattr(G, "_sample", lambda *a, **k: passes.append(len(a[2])) or real_sample(*a, **k))

    def postprocess(items):            # the first `rejected` checks fail, the rest pass
        out = [len(verdicts) + q >= rejected for q in range(len(items))]
        verdicts.extend(out)
        return out

    monkeypatch.setattr(G, "_postprocess_many", postprocess)
    for rejected, retry_rows, want_passes, want_retries in [(3, 4, [1, 4], 3), (3, 1, [1, 1, 1, 1], 3),
                                                            (99, 4, [1, 4, 1], 5)]:
        passes.clear()
        verdicts.clear()
        g = GenerationParams(attempts=1, retries=5, max_new_tokens=600, retry_rows=retry_rows)
        w = G.generate(model, tok, [ROWS[0]["prompt"]], g, kernels=[(matmul_mod, cpu_target)])
        assert (passes, w.retries, w.prompt_retries) == (want_passes, want_retries, [want_retries])
        assert w.complete == [[True]] and w.tokens == sum(w.prompt_tokens) > 0
    assert len(verdicts) == 5          # out of rewrites, the last one is kept without a check
    assert G.sampling_key(g) == G.sampling_key(dataclasses.replace(g, retry_rows=2, batch_rows=8))
    with pytest.raises(ParamsError, match="retry_rows"):
        GenerationParams(retry_rows=0)


def test_clean_stops_at_blank_line():
    assert clean("B x\nL b0 2\n\ngarbage") == "B x\nL b0 2"


def test_a_time_limit_stops_each_phase_and_the_model_ships_in_bf16(tmp_path):
    """A lent GPU gives a command 10 minutes: training stops where its budget runs out (here at
    once: one step per phase) and says so; a bf16-trained model is saved at half the size."""
    from pipeline import files, models

    p = _params(tmp_path, time_limit_s=0.0)
    model, tok, history, info = train_sft.train(p, ROWS, CORPUS, progress=False)
    assert info["stopped_at"] == {"pretrain": 1, "sft": 1} and info["runtime_s"]["sft"] > 0
    assert max(s for ph, s, _ in history if ph == "sft") <= 1
    fp32 = files.save_model_dir(model, tok, tmp_path / "fp32")
    half = files.save_model_dir(model, tok, tmp_path / "half", bf16=True)
    size = lambda d: sum(f.stat().st_size for f in d.glob("*.safetensors"))
    assert size(half) < 0.6 * size(fp32)
    loaded, _ = models.load(half)
    assert next(loaded.parameters()).dtype == torch.bfloat16
