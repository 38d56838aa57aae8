"""Small random-weight models of the draft families users deploy, each with a byte-level BPE tokenizer
trained here and its family's chat template and special tokens.

Random weights give near-uniform logits; the output side is sharpened so that a greedy path means
something (a flipped argmax is then a real disagreement, not a tie broken by rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB = 512
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)

TINY_GEMMA3 = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1
)


@dataclass(frozen=True)
class Family:
    specials: tuple[str, ...]  # bos first where the family has one; eos = the end-of-turn token
    bos: str | None
    eos: str
    template: str


_CHATML = Family(
    ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    None,
    "<|im_end|>",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
)
_GEMMA = Family(
    ("<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"),
    "<bos>",
    "<end_of_turn>",
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
)
FAMILIES = {
    "llama": Family(
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>",
        "<|eot_id|>",
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    ),
    "qwen2": _CHATML,
    "qwen3": _CHATML,
    "mistral": Family(
        ("<s>", "</s>", "[INST]", "[/INST]"),
        "<s>",
        "</s>",
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}"
        "{{ eos_token }}{% else %}[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}",
    ),
    "phi3": Family(
        ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"),
        None,
        "<|end|>",
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    ),
    "gemma2": _GEMMA,
    "gemma3": _GEMMA,
}
CORPUS = [
    "Explain how a rainbow forms, step by step.",
    "Write a short email asking to move our meeting to Friday.",
    "What is 17 times 23? Show your work.",
    "def add(a, b):\n    return a + b\n",
    "Translate 'good morning' to French.",
    "List three uses of a paperclip.",
    "The quick brown fox jumps over the lazy dog.",
    "用一句话介绍长城。",
    "¿Cuál es la capital de Francia?",
    "Answer in JSON with keys name and age.",
    "system user assistant model",
] * 8


def config(name: str, tok):
    """The family's config at test size, with the tokenizer's special ids."""
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    ids = dict(
        eos_token_id=tok.convert_tokens_to_ids(tok.eos_token),
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        **COMMON,
    )
    return {
        "llama": lambda: LlamaConfig(
            **ids,
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "qwen2": lambda: Qwen2Config(**ids, tie_word_embeddings=True),
        "qwen3": lambda: Qwen3Config(**ids, head_dim=32, tie_word_embeddings=True),
        # windows shorter than the parity prompt + 16 steps, so the masks are exercised
        "mistral": lambda: MistralConfig(**ids, sliding_window=32),
        "phi3": lambda: Phi3Config(**ids, sliding_window=32, tie_word_embeddings=False),
        "gemma2": lambda: Gemma2Config(
            **ids,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=32,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        # 7 layers: 5 local, 1 global, 1 local (layer_types' 5:1 pattern); a window of 8, so every decode step
        # of parity is past it; the local layers' rotary base (10k) apart from the global ones' (1M, scaled
        # linearly as Gemma 3 4B+ is); query_pre_attn_scalar apart from head_dim; soft-capping unset (None)
        "gemma3": lambda: Gemma3TextConfig(
            **{**ids, **TINY_GEMMA3},
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=8,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            architectures=["Gemma3ForCausalLM"],
        ),
    }[name]()


def tokenizer(name: str):
    """A byte-level BPE of VOCAB tokens with the family's specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(fam.specials),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.specials[0],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = fam.template
    return fast


def build(name: str, out: Path) -> Path:
    """Save family ``name`` (random weights, seed 0) with its tokenizer to ``out``; returns ``out``."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = tokenizer(name)
    cfg = config(name, tok)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(4.0 if cfg.tie_word_embeddings else 20.0)
    model.generation_config = GenerationConfig(
        eos_token_id=cfg.eos_token_id, bos_token_id=cfg.bos_token_id, pad_token_id=cfg.pad_token_id
    )
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
