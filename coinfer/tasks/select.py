"""``select``: budgeted selection (docs/design.md §3.2).

Prompt:  ``Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8.``  items are ``id(cost,value)``
Answer:  ``AB 7:7; AC 5:11; AD 8:12; BC 6:8; BD 9>8; CD 7:13; answer C,D``

The answer enumerates every k-subset as ``<ids> <cost>:<value>`` (or
``<ids> <cost>><budget>`` when over budget), then names the best. Each step is
checkable; the grade is exact against the optimum found by enumeration. Ids are
single capital letters so that a subset is written by concatenation. A JSON
answer (``{"ids": ["C", "D"]}``, smart quotes and all) is accepted too.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import string
from typing import Any

from coinfer.errors import InvalidArgument
from coinfer.rulespec import Rule
from coinfer.tasks.base import MAX_PARTIAL_CHARS, Parsed, Problem, Task, split_steps
from coinfer.text import normalize

POOL_SIZE, PICK, MAX_COST, MAX_VALUE = 4, 2, 9, 9
MAX_POOL = 12  # enumeration is C(n, k): keep requests small enough to verify instantly
_PROMPT_RE = re.compile(r"^\s*Pick\s+(\d+)\s+of\s+((?:[A-Z]\(\d+,\d+\)\s*)+)with\s+cost\s*<=\s*(\d+)\s*\.?\s*$")
_ITEM_RE = re.compile(r"([A-Z])\((\d+),(\d+)\)")
_STEP_RE = re.compile(r"\b([A-Z]{2,})\s+(\d+)\s*(?::\s*(\d+)|>\s*(\d+))")
_ANSWER_RE = re.compile(r"answer[\"']?\s*(?:is)?\s*[:=]?\s*([A-Z](?:\s*,\s*[A-Z]\b)*)", re.IGNORECASE)
_JSON_RE = re.compile(r"\{[^{}]*\}")


def _step_match(step: str) -> re.Match[str] | None:
    """One step (``AB 7:15`` or ``AC 12>8``) as a whole, spacing collapsed."""
    return _STEP_RE.fullmatch(" ".join(normalize(step).split()))


def optimum(pool: dict[str, tuple[int, int]], k: int, budget: int) -> int | None:
    """Best total value of k distinct items with total cost <= budget (None if none fits)."""
    best = None
    for combo in itertools.combinations(pool, k):
        cost = sum(pool[i][0] for i in combo)
        if cost <= budget:
            value = sum(pool[i][1] for i in combo)
            best = value if best is None else max(best, value)
    return best


class SelectTask(Task):
    name = "select"
    checkers = {
        "select_steps": "every listed subset's cost and value recomputed",
        "select_budget": "total cost of the chosen ids within the budget",
        "select_choice": "where steps are shown: every k-subset is listed and the answer is the best listed one",
    }

    def generate(self, rng: random.Random) -> Problem:
        while True:
            ids = [chr(ord("A") + i) for i in range(POOL_SIZE)]
            pool = {i: (rng.randint(1, MAX_COST), rng.randint(1, MAX_VALUE)) for i in ids}
            costs = sorted(sum(pool[i][0] for i in c) for c in itertools.combinations(ids, PICK))
            # a budget between the cheapest and the dearest subset: some fit, some don't
            budget = rng.randint(costs[0], costs[-1])
            if optimum(pool, PICK, budget) is not None:
                break
        items = " ".join(f"{i}({c},{v})" for i, (c, v) in pool.items())
        prompt = f"Pick {PICK} of {items} with cost<={budget}."
        return Problem(self.name, prompt, {"pool": pool, "k": PICK, "budget": budget})

    def parse_problem(self, prompt: str) -> dict[str, Any]:
        m = _PROMPT_RE.match(" ".join(normalize(prompt).split()))  # collapsed: linear (arith.parse_problem)
        if not m:
            raise InvalidArgument(
                "problem.prompt: not a select problem; expected 'Pick <k> of A(<cost>,<value>) B(...) ... with cost<=<budget>.'"
            )
        pool = {i: (int(c), int(v)) for i, c, v in _ITEM_RE.findall(m.group(2))}
        k, budget = int(m.group(1)), int(m.group(3))
        if len(pool) != len(_ITEM_RE.findall(m.group(2))):
            raise InvalidArgument("problem.prompt: duplicate item id in the pool")
        if not 1 <= k <= len(pool) or len(pool) > MAX_POOL:
            raise InvalidArgument(
                f"problem.prompt: need 1 <= k <= pool size <= {MAX_POOL}, got k={k}, pool={len(pool)}"
            )
        return {"pool": pool, "k": k, "budget": budget}

    def solve(self, spec: dict[str, Any]) -> str:
        pool, k, budget = spec["pool"], spec["k"], spec["budget"]
        steps, best, best_value = [], None, -1
        for combo in itertools.combinations(pool, k):
            cost = sum(pool[i][0] for i in combo)
            if cost > budget:
                steps.append(f"{''.join(combo)} {cost}>{budget}")
                continue
            value = sum(pool[i][1] for i in combo)
            steps.append(f"{''.join(combo)} {cost}:{value}")
            if value > best_value:
                best, best_value = combo, value
        answer = ",".join(best) if best else "none"
        return "; ".join(steps + [f"answer {answer}"])

    def parse_answer(self, text: str) -> Parsed:
        clean = " ".join(normalize(text).split())  # collapsed: every \s* matches one char at most
        steps = [(s, int(c), int(v) if v else None, int(b) if b else None) for s, c, v, b in _STEP_RE.findall(clean)]
        fields: dict[str, Any] = {"steps": steps}
        ids = None
        for blob in reversed(_JSON_RE.findall(clean)):
            try:
                obj = json.loads(blob)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("ids"), list):
                ids = [str(i).strip().upper() for i in obj["ids"]]
                break
        if ids is None:
            answers = _ANSWER_RE.findall(clean)
            if not answers:
                return Parsed(
                    fields, "parse_error: no 'answer <ids>' found" + (" (truncated?)" if clean.strip() else " (empty)")
                )
            ids = [i.strip().upper() for i in answers[-1].split(",")]
        fields["ids"] = ids
        return Parsed(fields)

    @staticmethod
    def _k_distinct(spec: dict[str, Any], subset: str) -> bool:
        """``subset`` names k distinct ids: a subset the task asks for (its ids may still be off the pool)."""
        return len(set(subset)) == len(subset) == spec["k"]

    @staticmethod
    def _step_text(subset: str, cost: int, value: int, budget: int) -> str:
        """A step as the task writes it: ``AC 5:11``, or ``BD 9>8`` over the budget."""
        return f"{subset} {cost}>{budget}" if cost > budget else f"{subset} {cost}:{value}"

    def _totals(self, spec: dict[str, Any], ids: list[str]) -> tuple[int, int] | None:
        pool = spec["pool"]
        if any(i not in pool for i in ids):
            return None
        return sum(pool[i][0] for i in ids), sum(pool[i][1] for i in ids)

    def check(self, checker: str, spec: dict[str, Any], parsed: Parsed) -> str:
        pool, budget = spec["pool"], spec["budget"]
        if checker == "select_steps":
            for subset, cost, value, over in parsed.fields.get("steps", []):
                totals = self._totals(spec, list(subset))
                if totals is None:
                    return f"step_invalid: {subset} has an id not in the pool"
                if cost != totals[0]:
                    return f"step_wrong: {subset} cost {cost} (expected {totals[0]})"
                if over is not None and (over != budget or cost <= budget):
                    return f"step_wrong: {subset} {cost}>{over} (budget is {budget})"
                if value is not None and value != totals[1]:
                    return f"step_wrong: {subset} value {value} (expected {totals[1]})"
            return ""
        if checker == "select_choice":
            return self._choice_error(spec, parsed)
        if checker == "select_budget":
            ids = parsed.fields.get("ids", [])
            totals = self._totals(spec, ids)
            if totals is None:
                bad = next(i for i in ids if i not in pool)
                return f"id_not_in_pool: {bad} (pool: {','.join(pool)})"
            if totals[0] > budget:
                return f"budget_exceeded: sum={totals[0]} > {budget}"
            return ""
        raise InvalidArgument(
            f"rules.params.check: unknown checker {checker!r} for select (known: {', '.join(self.checkers)})"
        )

    @staticmethod
    def _best_listed(parsed: Parsed) -> tuple[str | None, int, int]:
        """(the best fitting subset the steps list, its value, the value listed for the chosen one: -1
        when not listed as fitting)."""
        listed = {"".join(sorted(s)): (v if o is None else None) for s, _, v, o in parsed.fields.get("steps", [])}
        fitting = {s: v for s, v in listed.items() if v is not None}
        best = max(fitting, key=lambda s: fitting[s], default=None)
        chosen = "".join(sorted(parsed.fields.get("ids", [])))
        return best, fitting.get(best, -1) if best else -1, fitting.get(chosen, -1)

    @staticmethod
    def _choice_error(spec: dict[str, Any], parsed: Parsed) -> str:
        """The answer must follow from the draft's own listed steps (as arith's answer must equal its
        last step): every k-subset listed, and the chosen one the best of those listed as fitting. An
        answer without steps (the JSON form) is left to the other rules."""
        steps = parsed.fields.get("steps", [])
        if not steps:
            return ""
        listed = {"".join(sorted(s)) for s, _, _, _ in steps}
        for combo in itertools.combinations(sorted(spec["pool"]), spec["k"]):
            if "".join(combo) not in listed:
                return f"step_missing: subset {''.join(combo)} not listed"
        best, best_value, chosen_value = SelectTask._best_listed(parsed)
        if best is not None and chosen_value < best_value:
            chosen = "".join(sorted(parsed.fields.get("ids", [])))
            return f"answer_mismatch: answer {','.join(chosen)} but {best} is listed with the best value {best_value}"
        return ""

    def corrected_prefix(self, spec: dict[str, Any], text: str) -> str | None:
        """The right steps, then the first wrong one rewritten with its subset's true cost and value
        (sums over the ids the model listed); where every step is right but the answer is not the best
        subset the steps list, the steps and that subset as the answer (a comparison of the model's own
        values). The subsets listed stay the model's."""
        steps, ok = split_steps(text), self.verified_prefix(spec, text)
        if len(ok) == len(steps):
            parsed = self.parse_answer(text)
            best, best_value, chosen_value = self._best_listed(parsed)
            if not ok or parsed.error or best is None or chosen_value >= best_value:
                return None
            return "; ".join(ok + [f"answer {','.join(best)}"])
        m = _step_match(steps[len(ok)])
        totals = self._totals(spec, list(m.group(1))) if m else None
        if totals is None:
            return None
        return "; ".join(ok + [self._step_text(m.group(1), *totals, spec["budget"])]) + ";"

    def step_completion(self, spec: dict[str, Any], partial: str) -> str | None:
        """``partial`` (spacing collapsed) begins a step of distinct pool ids, at most k of them, then
        maybe a prefix of the subset's true `` cost:value`` (or `` cost>budget``): the rest, the subset
        filled up with the first unused ids of the pool where it has fewer than k (``AB`` -> `` 7:15``,
        ``A`` -> ``B 7:15``)."""
        s, k, pool = " ".join(normalize(partial).split()), spec["k"], spec["pool"]
        if not s or k < 2 or len(partial) > MAX_PARTIAL_CHARS:  # _STEP_RE: a subset of two ids or more
            return None
        n = len(s) - len(s.lstrip(string.ascii_uppercase))
        ids, rest = s[:n], s[n:]
        short = n < k and (rest or partial[-1].isspace())  # "A B", "A ": the ids ended before k of them
        if not ids or len(ids) > k or len(set(ids)) < n or any(i not in pool for i in ids) or short:
            return None
        subset = ids + "".join(i for i in pool if i not in ids)[: k - n]
        step = self._step_text(subset, *self._totals(spec, list(subset)), spec["budget"])
        return step[n + len(rest) :] if step[n:].startswith(rest) else None

    def repaired(self, spec: dict[str, Any], text: str) -> str | None:
        """Every listed subset's cost and value recomputed in place (``AC 7:9`` -> ``AC 7:8``, ``AD 9:5`` ->
        ``AD 9>8`` over the budget); the subsets listed and the answer chosen stay the model's. A subset
        with an id not in the pool, or not k distinct ids, is left as written (its rules fail).
        ``_STEP_RE`` on the raw text: no nested quantifiers, linear."""

        def fix(m: re.Match[str]) -> str:
            subset = m.group(1)
            totals = self._totals(spec, list(subset))
            if totals is None or not self._k_distinct(spec, subset):
                return m.group(0)
            return self._step_text(subset, *totals, spec["budget"])

        out = _STEP_RE.sub(fix, text)
        return out if out != text else None

    def step_ok(self, spec: dict[str, Any], step: str) -> bool:
        return self.step_error(spec, step) == ""

    def step_error(self, spec: dict[str, Any], step: str) -> str | None:
        m = _step_match(step)
        if not m:
            return None
        subset, cost, value, over = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if not self._k_distinct(spec, subset):
            # listed, it would stand among the subsets the answer must be the best of (select_choice)
            return f"step_off_task: {subset} is not {spec['k']} distinct ids"
        one = Parsed({"steps": [(subset, cost, int(value) if value else None, int(over) if over else None)]})
        return self.check("select_steps", spec, one)

    def grade(self, spec: dict[str, Any], parsed: Parsed) -> bool:
        ids = parsed.fields.get("ids")
        if not parsed.ok or not ids or len(ids) != spec["k"] or len(set(ids)) != len(ids):
            return False
        totals = self._totals(spec, ids)
        return (
            totals is not None
            and totals[0] <= spec["budget"]
            and totals[1] == optimum(spec["pool"], spec["k"], spec["budget"])
        )

    def default_rules(self, spec: dict[str, Any]) -> list[Rule]:
        k = spec["k"]
        return [
            Rule("task_check", {"check": "select_steps"}),
            Rule("membership", {"field": "ids", "values": list(spec["pool"])}),
            Rule("count", {"field": "ids", "min": k, "max": k, "unique": True}),
            Rule("task_check", {"check": "select_budget"}),
            Rule("task_check", {"check": "select_choice"}),
        ]

    def structure_key(self, parsed: Parsed) -> tuple:
        return (tuple(parsed.fields.get("steps", [])), tuple(sorted(parsed.fields.get("ids", []))))
