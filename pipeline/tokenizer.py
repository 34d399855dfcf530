"""The project's tokenizer: byte-level BPE trained with `tokenizers` on our own texts
(prompts and scripts), wrapped in `PreTrainedTokenizerFast` so it saves and loads like any
Hugging Face tokenizer (`save_pretrained` / `AutoTokenizer.from_pretrained`)."""

from __future__ import annotations

from typing import Iterable

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    # Split on whitespace and punctuation boundaries but keep digits one by one, so numbers
    # (tile factors, extents) are composed from digits rather than memorised as wholes.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)
