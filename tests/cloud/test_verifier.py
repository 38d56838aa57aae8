"""Judge output parsing: anything malformed becomes an invalid verdict with an error, never a crash."""

import pytest

from coinfer.cloud.verifier import JUDGE_SCHEMA, judge_prompt, parse_judge


def test_well_formed_verdicts():
    assert parse_judge('{"valid": true, "score": 0.9, "error": ""}') == (True, 0.9, "")
    assert parse_judge('{"valid": false, "score": 0.1, "error": "step 2 wrong"}') == (False, 0.1, "step 2 wrong")


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("", "malformed output"),
        ('{"valid": true, "score": 0.', "malformed output"),
        ('{"valid": true, "score": 1.5, "error": ""}', "score"),
        ('{"valid": "maybe", "score": 0.5, "error": ""}', "valid"),
        ('{"score": 0.5}', "valid"),
        ("[1, 2]", "output"),
    ],
)
def test_malformed_judge_output_is_an_error_verdict(text, fragment):
    valid, score, error = parse_judge(text)
    assert (valid, score) == (False, 0.0) and error.startswith("judge:") and fragment in error


def test_prompt_and_schema():
    p = judge_prompt("If x=1 and y=2, compute x+y.", "1+2=3; answer 3")
    assert "compute x+y" in p and "answer 3" in p and p.endswith("\n")
    assert set(JUDGE_SCHEMA["required"]) == {"valid", "score", "error"}
