"""Prompts for calibration and accuracy gates: the task generators, or a JSONL file.

Calibration draws from the train side of the task split and the gates from the
held-out side (``coinfer.tasks.is_held_out``), so a gate never grades a model on
the prompts its activation ranges were fitted to. A calibration file holds one
JSON object per line, ``{"task": "arith", "prompt": "..."}`` (``task`` optional:
without it the prompt is an open request, not graded); a bad line is an error naming the
line. A prompt is a user turn: it reaches the model rendered with the model's own chat
template (``TaskPrompt.ids``), exactly as the edge renders a request.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.errors import CoinferError
from coinfer.tasks import TASKS, Problem, problems

MAX_PROMPT_CHARS = 4096


class PromptFileError(ValueError):
    """A calibration file line is unusable; the message names file and line."""


@dataclass(frozen=True)
class TaskPrompt:
    text: str  # the user turn
    problem: Problem | None = None  # None for free text: no grade

    def model_text(self, chat: ChatFormat) -> str:
        """The prompt as a model with chat format ``chat`` reads it."""
        return chat.render([ChatMessage("user", self.text)])

    def ids(self, tokenizer: Tokenizer, chat: ChatFormat) -> list[int]:
        """Token ids of ``model_text`` (a template writes BOS itself; plain text gets it added)."""
        return tokenizer.encode(self.model_text(chat), add_special_tokens=not chat.templated).ids


def task_prompts(n: int, held_out: bool, tasks: tuple[str, ...] = tuple(TASKS), seed: int = 0) -> list[TaskPrompt]:
    """``n`` problems, alternating over ``tasks`` deterministically."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = next(problems(rng, (tasks[i % len(tasks)],), held_out))
        out.append(TaskPrompt(p.prompt, p))
    return out


def read_prompt_file(path: Path) -> list[TaskPrompt]:
    if not path.is_file():
        raise PromptFileError(f"{path}: calibration file missing")
    out: list[TaskPrompt] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise PromptFileError(f'{where}: expected an object with a non-empty string "prompt"')
        if len(obj["prompt"]) > MAX_PROMPT_CHARS:
            raise PromptFileError(f"{where}: prompt of {len(obj['prompt'])} chars exceeds {MAX_PROMPT_CHARS}")
        task = obj.get("task")
        if task is None:
            out.append(TaskPrompt(obj["prompt"]))
        elif task not in TASKS:
            raise PromptFileError(f"{where}: task: unknown {task!r} (known: {', '.join(TASKS)})")
        else:
            t = TASKS[task]
            try:
                problem = t.problem(obj["prompt"])
            except CoinferError as exc:
                raise PromptFileError(f"{where}: {exc}") from None
            out.append(TaskPrompt(obj["prompt"], problem))
    if not out:
        raise PromptFileError(f"{path}: no prompts")
    return out
