"""The judge verifier: an instruction-tuned model grades a draft as JSON ``{valid, score, error}``.

vLLM's structured outputs constrain decoding to ``JUDGE_SCHEMA``, so a
well-behaved run always parses; a run cut off by its token budget, or a model
that answers nonsense inside the schema, still never breaks a session: the
verdict becomes invalid with an error that says what was wrong.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, Field, ValidationError


class JudgeVerdict(BaseModel):
    valid: bool
    score: float = Field(ge=0.0, le=1.0)
    error: str = Field(default="", max_length=200)


JUDGE_SCHEMA = {
    "type": "object",
    "properties": {
        "valid": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "error": {"type": "string", "maxLength": 200},
    },
    "required": ["valid", "score", "error"],
    "additionalProperties": False,
}
JUDGE_MAX_TOKENS = 96


def judge_prompt(problem: str, draft: str) -> str:
    return (
        f"You are a strict verifier. Problem:\n{problem.strip()}\nProposed solution:\n{draft.strip()}\n"
        'Reply with JSON {"valid": true|false, "score": 0..1, "error": "<first wrong step or empty>"}.\n'
    )


def parse_judge(text: str) -> tuple[bool, float, str]:
    """(valid, score, error) from the judge's output; malformed output -> (False, 0.0, what was wrong)."""
    try:
        v = JudgeVerdict.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        return False, 0.0, f"judge: malformed output ({exc.msg} at char {exc.pos}): {text[:60]!r}"
    except ValidationError as exc:
        err = exc.errors()[0]
        return False, 0.0, f"judge: {'.'.join(map(str, err['loc'])) or 'output'}: {err['msg']}"
    return v.valid, v.score, v.error
