"""Character-level tokenizer for the demo models, in Hugging Face format.

One token per printable ASCII character plus four specials. Character level
because the tasks are arithmetic and ids: a sub-word vocabulary would hide the
digits the model must compute with, and a 100-token vocabulary keeps the
embedding and LM head tiny. It carries a chat template so that OpenAI-style
chat endpoints (vLLM's, the edge's) accept it.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
# A user turn is the prompt; the model answers on the next line, exactly as in training.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] | trim }}\n{% endif %}{% endfor %}"
)


def vocab() -> dict[str, int]:
    v = {s: i for i, s in enumerate(SPECIALS)}
    for ch in CHARS:
        v[ch] = len(v)
    return v


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(vocab(), unk_token="<unk>"))
    # every character is its own pre-token; [\s\S] because "." would skip "\n"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=512, clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode(text: str, table: dict[str, int] | None = None) -> list[int]:
    """Fast path used by training: ids without specials (same as the HF tokenizer)."""
    table = table or vocab()
    return [table.get(ch, UNK_ID) for ch in text]


def save(path: Path) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    tok.save_pretrained(str(path))
    return tok
