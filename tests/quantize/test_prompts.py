"""Calibration / gate prompts: the task split and the JSONL reader's errors."""

import json

import pytest

from coinfer.chat import ChatFormat
from coinfer.quantize.prompts import PromptFileError, read_prompt_file, task_prompts
from coinfer.tasks import is_held_out


def test_task_prompts_come_from_the_requested_side_of_the_split():
    held = task_prompts(20, held_out=True)
    train = task_prompts(20, held_out=False)
    assert all(is_held_out(p.problem.prompt) for p in held)
    assert not any(is_held_out(p.problem.prompt) for p in train)
    assert {p.problem.task for p in held} == {"arith", "select"}
    assert held == task_prompts(20, held_out=True)  # deterministic
    assert all(p.text == p.problem.prompt for p in held)  # the user turn; the model's template renders it
    plain = ChatFormat()
    assert held[0].model_text(plain) == f"User: {held[0].text}\nAssistant:"
    templated = ChatFormat(
        template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert held[0].model_text(templated) == f"<s>{held[0].text}\n"


def test_prompt_file_lines(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps({"task": "arith", "prompt": "If x=1 and y=2, compute x+y."})
        + "\n\n"
        + json.dumps({"prompt": "hi"})
        + "\n"
    )
    got = read_prompt_file(f)
    assert [p.text for p in got] == ["If x=1 and y=2, compute x+y.", "hi"]
    assert got[0].problem is not None and got[1].problem is None


@pytest.mark.parametrize(
    "body,msg",
    [
        ("[1, 2]\n", "c.jsonl:1: expected an object"),
        ('{"prompt": ""}\n', "c.jsonl:1: expected an object"),
        ('{"prompt": "a"}\n{oops\n', "c.jsonl:2: not JSON"),
        ('{"prompt": "a", "task": "nope"}\n', "task: unknown 'nope'"),
        ('{"prompt": "Compute 1+2.", "task": "arith"}\n', "c.jsonl:1: problem.prompt: not an arith problem"),
        ('{"prompt": "' + "x" * 5000 + '"}\n', "exceeds 4096"),
        ("\n\n", "no prompts"),
    ],
)
def test_bad_prompt_files_name_the_line(tmp_path, body, msg):
    f = tmp_path / "c.jsonl"
    f.write_text(body)
    with pytest.raises(PromptFileError, match=msg):
        read_prompt_file(f)
    with pytest.raises(PromptFileError, match="missing"):
        read_prompt_file(tmp_path / "none.jsonl")


def test_accuracy_gate_says_when_it_cannot_judge():
    from coinfer.quantize.gates import GateConfig, accuracy_gate

    cfg = GateConfig()
    judged = accuracy_gate(ref_ok=30, cand_ok=27, graded=100, cfg=cfg)
    assert judged.value == pytest.approx(0.03) and judged.passed and judged.message.startswith("accuracy_drop 0.030")
    assert not accuracy_gate(ref_ok=40, cand_ok=20, graded=100, cfg=cfg).passed
    blind = accuracy_gate(ref_ok=0, cand_ok=0, graded=100, cfg=cfg)  # a model that never learnt the task
    assert blind.value is None and "not applicable" in blind.message and "cannot judge" in blind.message
    assert "not applicable" in accuracy_gate(0, 0, 0, cfg).message
