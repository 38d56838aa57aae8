"""coinfer.validate: the checks every request gets on both sides, with the field each refusal names."""

from __future__ import annotations

import pytest

from coinfer.chat import ChatMessage
from coinfer.errors import InvalidArgument, ResourceExhausted
from coinfer.validate import (
    MAX_DEADLINE_MS,
    MAX_DRAFT_MODEL,
    MAX_REQUEST_ID,
    check_deadline,
    check_draft_model,
    check_question,
    check_request_id,
)


def test_a_question_is_a_prompt_or_a_conversation_within_the_limit():
    assert check_question("Why?", [], 10) == "prompt"
    assert check_question("", [ChatMessage("user", "Why?")], 10, where="problem.") == "problem.messages"
    with pytest.raises(InvalidArgument) as err:
        check_question("Why?", [ChatMessage("user", "Why?")], 10)
    assert err.value.field == "prompt" and "not both" in err.value.message
    with pytest.raises(InvalidArgument) as err:
        check_question("   ", [], 10, where="problem.")
    assert err.value.field == "problem.prompt"
    with pytest.raises(ResourceExhausted) as over:
        check_question("x" * 11, [], 10)
    assert over.value.field == "prompt" and over.value.message == "prompt: 11 chars > limit 10"
    with pytest.raises(ResourceExhausted) as over:
        check_question("", [ChatMessage("system", "x" * 6), ChatMessage("user", "y" * 5)], 10)
    assert over.value.field == "messages"  # the whole conversation counts


def test_request_ids_and_deadlines_have_their_bounds():
    check_request_id("r" * MAX_REQUEST_ID)
    with pytest.raises(InvalidArgument) as err:
        check_request_id("r" * (MAX_REQUEST_ID + 1))
    assert err.value.field == "request_id"
    check_deadline(0)  # the server's default
    check_deadline(MAX_DEADLINE_MS)
    for bad in (-1, MAX_DEADLINE_MS + 1):
        with pytest.raises(InvalidArgument, match=r"deadline_ms: must be in 0\.\.600000"):
            check_deadline(bad)
    with pytest.raises(InvalidArgument, match=r"0\.\.1000, got 1001"):
        check_deadline(1001, max_ms=1000)


def test_a_draft_model_identity_has_its_bound():
    check_draft_model("")  # an older edge
    check_draft_model("sha256:" + "0" * 64)
    with pytest.raises(InvalidArgument) as err:
        check_draft_model("x" * (MAX_DRAFT_MODEL + 1))
    assert err.value.field == "draft_model"
