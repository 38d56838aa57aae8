"""The HTTP API's request bodies: coinfer's own options belong in the ``coinfer`` object, and one sent beside
OpenAI's fields is refused naming it (extra fields are otherwise accepted and change nothing)."""

import pytest
from pydantic import ValidationError

from coinfer.edge.http_body import COINFER_OPTIONS, ChatBody

MESSAGES = [{"role": "user", "content": "hi"}]
VALUES = {"task": "arith", "extraction": "marker", "rules": [], "plan": "split", "num_drafts": 2, "deadline_ms": 1000}


@pytest.mark.parametrize("option", COINFER_OPTIONS)
def test_a_coinfer_option_at_the_top_is_refused_naming_it_and_taken_inside_coinfer(option):
    with pytest.raises(ValidationError) as err:
        ChatBody(model="m", messages=MESSAGES, **{option: VALUES[option]})
    (e,) = err.value.errors()
    assert e["loc"] == (option,) and '{"coinfer": {"' + option in e["msg"]
    body = ChatBody(model="m", messages=MESSAGES, coinfer={option: VALUES[option]})
    assert getattr(body.coinfer, option) is not None


def test_other_extra_fields_are_accepted_and_an_option_sent_null_asks_for_nothing():
    body = ChatBody(model="m", messages=MESSAGES, user="u", metadata={"a": "b"}, plan=None)
    assert body.plan is None and body.coinfer.plan == "auto"
