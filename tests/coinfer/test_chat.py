"""Conversations: rendering with a model's template (same as transformers), the plain format,
refinement prompts, validation."""

import pytest

from coinfer.chat import ChatFormat, ChatMessage, refine_question, validate_messages, with_question
from coinfer.errors import InvalidArgument

CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONV = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "2+2?"),
    ChatMessage("assistant", "4"),
    ChatMessage("user", "Explain why the sky is blue."),
]


def test_template_renders_like_transformers(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>")),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    tok.chat_template = CHATML
    tok.save_pretrained(str(tmp_path))
    ours = ChatFormat.from_dir(tmp_path)
    msgs = [{"role": m.role, "content": m.content} for m in CONV]
    assert ours.templated and ours.bos_token == "<s>"
    assert ours.render(CONV) == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours.render(CONV, add_generation_prompt=False) == tok.apply_chat_template(msgs, tokenize=False)


def test_plain_format_without_template(tmp_path):
    fmt = ChatFormat.from_dir(tmp_path)  # no tokenizer_config.json
    assert not fmt.templated
    assert fmt.render(CONV) == "Be brief.\n\nUser: 2+2?\nAssistant: 4\nUser: Explain why the sky is blue.\nAssistant:"


def test_refinement_prompt_keeps_history_and_numbers_candidates():
    q = refine_question("How many?", ["a\nAnswer: 1", " b "])
    assert q == (
        "How many?\n\nCandidate solutions (they may contain mistakes):\n(1) a\nAnswer: 1\n(2) b\n"
        "Write the correct solution."
    )
    out = with_question(CONV, q)
    assert out[:3] == CONV[:3] and out[3] == ChatMessage("user", q)


@pytest.mark.parametrize(
    "msgs,field",
    [
        ([], "messages"),
        ([ChatMessage("robot", "x")], "messages[0].role"),
        ([ChatMessage("user", "q"), ChatMessage("assistant", "a")], "messages[1].role"),
        ([ChatMessage("user", "  ")], "messages[0].content"),
    ],
)
def test_bad_conversations_name_the_field(msgs, field):
    with pytest.raises(InvalidArgument, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_messages(msgs)
