"""Prompts for calibration and accuracy gates: a generic set shipped here, the task generators, or a JSONL file.

Which prompts, when the user gives no file:

- a model that declares built-in tasks (``"coinfer_tasks": ["arith", ...]`` in its
  ``config.json``) is calibrated and gated on those tasks' prompts, and only then is its task
  accuracy gated;
- any other model on ``data/generic_prompts.jsonl``: 160 everyday chat requests (questions,
  code, writing, structured output; English, Chinese, Spanish, French, German), graded by
  nothing but the task-free gates.

Calibration draws from the train side and the gates from the held-out side (task split:
``coinfer.tasks.is_held_out``; a file: even lines calibrate, odd lines gate), so a gate never
grades a model on the prompts its activation ranges were fitted to. A prompt file holds one
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
GENERIC_FILE = Path(__file__).with_name("data") / "generic_prompts.jsonl"


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


def halves(prompts: list[TaskPrompt], held_out: bool) -> list[TaskPrompt]:
    """One side of a prompt list that serves both calibration (even) and gates (odd)."""
    return prompts[int(held_out) :: 2] if len(prompts) > 1 else prompts


def declared_tasks(model_dir: Path) -> tuple[str, ...]:
    """The built-in tasks a model declares in its ``config.json`` (``coinfer_tasks``); () if none."""
    path = Path(model_dir) / "config.json"
    try:
        tasks = json.loads(path.read_text()).get("coinfer_tasks") or []
    except (OSError, ValueError):
        return ()
    if not isinstance(tasks, list) or any(t not in TASKS for t in tasks):
        raise PromptFileError(f"{path}: coinfer_tasks: expected a list of {', '.join(TASKS)}, got {tasks!r}")
    return tuple(tasks)


def default_prompts(model_dir: Path, n: int, held_out: bool, seed: int) -> list[TaskPrompt]:
    """``n`` prompts of the model's declared tasks, else of the shipped generic set (at most its half)."""
    tasks = declared_tasks(model_dir)
    if tasks:
        return task_prompts(n, held_out, tasks, seed)
    return halves(read_prompt_file(GENERIC_FILE), held_out)[:n]
