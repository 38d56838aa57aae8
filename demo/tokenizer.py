"""Byte-level BPE tokenizer for the demo models, in Hugging Face format, with a ChatML template.

Trained locally (``tokenizers``) on a deterministic corpus drawn from the task generators
(seeded), so it builds offline and identically everywhere. Digits are split one per token
(``Digits(individual_digits=True)`` before the byte-level pre-tokenizer): the models compute
with digits, a merged "48" would hide them.

Special tokens (ids fixed): ``<pad>`` 0, ``<s>`` 1 (BOS), ``<|im_end|>`` 2 (EOS = end of
turn), ``<unk>`` 3, ``<|im_start|>`` 4. A plain encode gets ``<s>`` prepended by the
post-processor; the chat template writes ``<s>`` itself, so rendered chat text is tokenized
with ``add_special_tokens=False``.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "<|im_end|>", "<unk>", "<|im_start|>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID, IM_START_ID = range(5)
VOCAB_SIZE = 1024
CORPUS_SEED, CORPUS_PER_TASK = 20240, 3000
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful math tutor. Show your steps.",
    "Answer the question step by step.",
    "You are a concise assistant that solves problems exactly.",
)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    """Deterministic training text: prompts and solutions of every task, refinement prompts, chat words."""
    from coinfer.chat import refine_question
    from coinfer.demo import wordprob
    from coinfer.tasks import TASKS

    rng = random.Random(CORPUS_SEED)
    out: list[str] = list(SYSTEM_PROMPTS) + ["user", "assistant", "system"]
    for task in TASKS.values():
        for _ in range(CORPUS_PER_TASK):
            p = task.generate(rng)
            out += [p.prompt, task.solve(p.spec)]
    for i in range(CORPUS_PER_TASK):
        w = wordprob.generate(rng)
        out += [w.prompt, w.solution]
        if i % 10 == 0:
            out.append(refine_question(w.prompt, [w.solution, wordprob.corrupt(w.solution, rng)]))
    return out


@lru_cache(maxsize=4)
def _trained(vocab_size: int = VOCAB_SIZE) -> str:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)]
    )
    return tok.to_str()


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The demo tokenizer with at most ``vocab_size`` tokens (the draft and the target use different
    sizes, so their merges differ: drafts must travel as text between two real tokenizers)."""
    tok = Tokenizer.from_str(_trained(vocab_size))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def vocab_size(cap: int = VOCAB_SIZE) -> int:
    return len(build_tokenizer(cap))


def encode(text: str, tok: PreTrainedTokenizerFast | None = None) -> list[int]:
    """Ids without added specials (special tokens written in the text are still recognised)."""
    tok = tok or build_tokenizer()
    return tok(text, add_special_tokens=False)["input_ids"]


def save(path: Path, vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    tok = build_tokenizer(vocab_size)
    tok.save_pretrained(str(path))
    return tok
