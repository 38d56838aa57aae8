"""The demo tokenizer: byte-level BPE, digits one per token, ChatML template with BOS."""

from transformers import AutoTokenizer

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.demo.tokenizer import BOS_ID, EOS_ID, IM_START_ID, PAD_ID, build_tokenizer, encode, save

TEXT = "If x=3 and y=5, compute (x+y)^2-x*y.\n3+5=8; answer 49"


def test_round_trip_with_bos_and_specials():
    tok = build_tokenizer()
    ids = tok(TEXT)["input_ids"]
    assert ids[0] == BOS_ID and ids[1:] == encode(TEXT, tok)
    assert tok.decode(ids, skip_special_tokens=True) == TEXT
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "<|im_end|>", "<pad>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert tok.convert_tokens_to_ids("<|im_start|>") == IM_START_ID
    assert 256 < len(tok) <= 4096


def test_digits_are_single_tokens_and_words_merge():
    tok = build_tokenizer()
    pieces = tok.tokenize("Natalia sold 480 clips.")
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["4", "8", "0"]
    assert len(pieces) < len("Natalia sold 480 clips.") / 2  # real sub-words, not characters


def test_tokenizer_is_deterministic():
    from coinfer.demo import tokenizer as bpe

    first = bpe._trained()
    bpe._trained.cache_clear()
    assert bpe._trained() == first


def test_chat_template_renders_like_transformers_and_tokenizes_with_one_bos(tmp_path):
    save(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [ChatMessage("system", "You are a helpful assistant."), ChatMessage("user", "If x=1 and y=2, compute x*y. ")]
    ours = ChatFormat.from_dir(tmp_path).render(msgs)
    theirs = tok.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in msgs], tokenize=False, add_generation_prompt=True
    )
    assert (
        ours
        == theirs
        == (
            "<s><|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nIf x=1 and y=2, compute x*y.<|im_end|>\n<|im_start|>assistant\n"
        )
    )
    ids = tok(ours, add_special_tokens=False)["input_ids"]  # as vLLM tokenizes a rendered chat
    assert ids[:2] == [BOS_ID, IM_START_ID] and ids.count(BOS_ID) == 1
    assert ids.count(EOS_ID) == 2


def test_answer_tokens_are_the_same_after_the_generation_prompt(tmp_path):
    """Canonical BPE: the prompt's tokens are a prefix of prompt + answer's (train == inference)."""
    save(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    head = ChatFormat.from_dir(tmp_path).render([ChatMessage("user", "If x=2 and y=3, compute x*y+x+y.")])
    p = tok(head, add_special_tokens=False)["input_ids"]
    full = tok(head + "2*3=6; 6+2=8; 8+3=11; answer 11<|im_end|>", add_special_tokens=False)["input_ids"]
    assert full[: len(p)] == p and full[-1] == EOS_ID
