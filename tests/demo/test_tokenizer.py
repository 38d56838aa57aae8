from demo.tokenizer import BOS_ID, EOS_ID, build_tokenizer, encode


def test_char_level_round_trip_with_bos():
    tok = build_tokenizer()
    text = "If x=3 and y=5, compute (x+y)^2-x*y.\n3+5=8; answer 49"
    ids = tok(text)["input_ids"]
    assert ids[0] == BOS_ID and ids[1:] == encode(text) and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.eos_token_id == EOS_ID


def test_chat_template_matches_the_training_format():
    tok = build_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "If x=1 and y=2, compute x*y. "}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<s>If x=1 and y=2, compute x*y.\n"
