"""``arith``: multi-step arithmetic written as checkable steps.

Prompt:  ``If x=3 and y=5, compute (x+y)^2-x*y.``
Answer:  ``3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49``

Steps are the post-order of the expression tree, each written with the numbers
it combines (variables substituted, negatives in parentheses), so every step
can be recomputed exactly. Steps written with the variable names
(``x+y=8``, as in the design's examples) are accepted and checked too.
"""

from __future__ import annotations

import ast
import functools
import itertools
import random
import re
import threading
from collections import Counter
from typing import Any

from coinfer.errors import InvalidArgument
from coinfer.rulespec import Rule
from coinfer.tasks.base import MAX_PARTIAL_CHARS, Parsed, Problem, Task
from coinfer.text import normalize

TEMPLATES = (
    "(x+y)^2-x*y",
    "x*y+x+y",
    "x^2-y",
    "x^2+y^2",
    "(x-y)^2+x*y",
    "x*y-y",
)
MAX_OPERAND = 9
# Besides the fixed templates, generated problems draw expressions from these
# shapes (a, b, c over {x, y}; o over + - *): thousands of distinct problems, so a
# model has to learn the arithmetic of a step rather than memorise answers.
SHAPES = ("(a o b)^2 o c", "a o b o c", "(a o b) o c", "a^2 o b", "a o (b o c)", "(a o b)^2")
MAX_VALUE, MIN_VALUE = 999, -99  # every step's value stays within these
_PROMPT_RE = re.compile(
    r"^\s*If\s+((?:[a-z]=-?\d+)(?:\s*(?:,|and)\s*[a-z]=-?\d+)*)\s*,\s*compute\s+([0-9a-z+\-*^() ]+?)\s*\.?\s*$"
)
_ASSIGN_RE = re.compile(r"([a-z])=(-?\d+)")
_STEP_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyz+-*^() ")
_STEP_END = frozenset("0123456789abcdefghijklmnopqrstuvwxyz)")
_VALUE_RE = re.compile(r" ?(-?\d+)")
_ONE_STEP_RE = re.compile(r"([0-9a-z+\-*^() ]*[0-9a-z)])\s*=\s*(-?\d+)")  # fullmatch only: one start, linear
_LITERAL_RE = re.compile(r"\(-\d+\)|\d+")  # an operand as a step writes it: 3, or (-3)
_PARTS_RE = re.compile(r"([;\n])")  # a draft's parts: steps, prose, the answer, with their separators kept
_WRITTEN_VALUE_RE = re.compile(r"(\s*)-?\d+")  # what follows a step's "=": its value, the space before it
MAX_REPAIRED_LITERALS = 4
"""A step with more number literals than this is repaired only in its value (``ArithTask.repaired``
tries each literal as written and as the latest repaired step's true value: at most 2^n variants, each
parsed: bounded work per step on client text)."""
MAX_OPERATORS = 64
"""An expression (prompt or step) with more operators is refused before it is parsed: evaluation
recurses once per operator, and a 1,000-term sum or 1,000 unary minus signs must be a clear error,
not a RecursionError (the demo's expressions have under 10)."""
_ANSWER_RE = re.compile(r"answer[\"']?\s*(?:is)?\s*[:=]?\s*(-?\d+)", re.IGNORECASE)
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Pow: "^"}
_MAX_ABS = 10**12  # evaluation guard: a hostile "9^9^9" must not hang the verifier


_AST_LOCK = threading.Lock()
"""CPython 3.11 keeps ``ast.parse``'s recursion depth per interpreter, not per thread: two threads
parsing while a garbage collection runs Python callbacks raise ``SystemError: AST constructor
recursion depth mismatch`` (seen when the servers parsed problems in worker threads)."""


def _tree(expr: str) -> ast.expr:
    ops = sum(expr.count(c) for c in "+-*^")
    if ops > MAX_OPERATORS or expr.count("(") > MAX_OPERATORS:
        raise ValueError(f"too long: {ops} operators, {expr.count('(')} parentheses (at most {MAX_OPERATORS} each)")
    try:
        with _AST_LOCK:
            node = ast.parse(expr.replace("^", "**"), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not an expression: {expr[:80]!r}") from exc
    return node


def evaluate(expr: str, env: dict[str, int]) -> int:
    """Evaluate + - * ^ over ints and variables in ``env``; ValueError if invalid."""
    return _evaluate(_tree(expr), env)


def operation(expr: str, env: dict[str, int]) -> tuple[str, int, int] | None:
    """What ``expr`` computes last: (operator, left value, right value), the operands in order for ``-`` and
    ``^`` and sorted for ``+`` and ``*``; None when its last operation is no binary one. ``3*4+3`` is
    ``("+", 3, 12)``: a step that folds several of the expression's steps into one ends on the last."""
    node = _tree(expr)
    if not isinstance(node, ast.BinOp) or type(node.op) not in _OPS:
        return None
    op, a, b = _OPS[type(node.op)], _evaluate(node.left, env), _evaluate(node.right, env)
    return (op, *sorted((a, b))) if op in "+*" else (op, a, b)


def _evaluate(tree: ast.expr, env: dict[str, int]) -> int:
    def ev(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ValueError(f"unknown variable {node.id!r}")
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                if not 0 <= b <= 8:
                    raise ValueError(f"exponent {b} out of range 0..8")
                r = a**b
            elif isinstance(node.op, ast.Add):
                r = a + b
            elif isinstance(node.op, ast.Sub):
                r = a - b
            else:
                r = a * b
            if abs(r) > _MAX_ABS:
                raise ValueError("value too large")
            return r
        raise ValueError(f"unsupported syntax in {ast.unparse(node)!r}")

    return ev(tree)


def written_steps(text: str) -> list[tuple[str, int]]:
    """Every ``<expression> = <int>`` in ``text`` (whitespace collapsed), left to right: the expression
    is the run of expression characters ending just before the "=". One pass over the text: the
    regular expression it replaces (``[...]*[...]\\s*=``) backtracked quadratically on long runs
    without an "=" (a 4 KB draft of letters)."""
    out: list[tuple[str, int]] = []
    floor = 0  # where the previous step's value ended: steps do not overlap
    at = text.find("=")
    while at >= 0:
        value = _VALUE_RE.match(text, at + 1)
        end = at - 1 if at > floor and text[at - 1] == " " else at  # one space before "=" (collapsed)
        if value and end > floor and text[end - 1] in _STEP_END:
            start = end - 1
            while start > floor and text[start - 1] in _STEP_CHARS:
                start -= 1
            out.append((text[start:end].replace(" ", ""), int(value.group(1))))
            floor = value.end()
        at = text.find("=", max(at + 1, floor))
    return out


def shape_error(tree: ast.expr) -> str:
    """Why an expression ``evaluate`` accepts has no plan of steps ('' when it has): the checkers read an
    answer as the value of its last step, so the expression must end on a binary operation, and a sign
    may only make a literal negative (``-(x+y)`` ends on no step, and ``compute x.`` has none: any answer
    passed both). Iterative: a client's nesting is bounded by ``MAX_OPERATORS``, not by the stack."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.UnaryOp) and not isinstance(node.operand, ast.Constant):
            term = ast.unparse(node.operand)[:80]
            return f"a sign before {term!r}: write it as 0-({term})"
        stack.extend(ast.iter_child_nodes(node))
    return (
        ""
        if isinstance(tree, ast.BinOp)
        else "it computes nothing: write at least one operation (+ - * ^) on the terms"
    )


def _with_value(part: str, value: int, lhs: str | None = None) -> tuple[str, str] | None:
    """A step's text up to its value rewritten as ``value`` (the space after "=" kept; its left side ``lhs``
    where given), and what followed the value; None when no number follows its last "="."""
    eq = part.rfind("=")
    m = _WRITTEN_VALUE_RE.match(part, eq + 1) if eq >= 0 else None
    if m is None:
        return None
    return (part[:eq] if lhs is None else lhs) + "=" + m.group(1) + str(value), part[m.end() :]


def _num(v: int) -> str:
    return str(v) if v >= 0 else f"({v})"  # "-3^2" would read as -(3^2)


def steps_for(expr: str, env: dict[str, int]) -> list[tuple[str, int]]:
    """Post-order steps ``(lhs, value)`` of ``expr`` (``shape_error`` says it has them); see the module
    docstring."""
    steps: list[tuple[str, int]] = []

    def walk(node: ast.expr) -> str:
        if isinstance(node, (ast.Name, ast.Constant)):
            return _num(env[node.id] if isinstance(node, ast.Name) else int(node.value))
        if isinstance(node, ast.UnaryOp):  # a negative literal ("(-3)"): parse_problem refused every other sign
            return _num(-int(node.operand.value))
        assert isinstance(node, ast.BinOp), ast.dump(node)
        lhs = f"{walk(node.left)}{_OPS[type(node.op)]}{walk(node.right)}"
        value = evaluate(lhs, env)
        steps.append((lhs, value))
        return _num(value)

    walk(_tree(expr))
    return steps


@functools.lru_cache(maxsize=1024)
def _plan(expr: str, env: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    return tuple(steps_for(expr, dict(env)))


def _env_key(spec: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """The problem's variables as the per-problem caches key them (``_plan``, ``_operations``, ``_step_texts``)."""
    return tuple(sorted(spec["vars"].items()))


def plan_of(spec: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """``steps_for`` the problem's expression, computed once per problem: the plan check and every
    step of a verified prefix ask for it (an AST parse under ``_AST_LOCK`` each time otherwise)."""
    return _plan(spec["expr"], _env_key(spec))


@functools.lru_cache(maxsize=1024)
def _operations(expr: str, env: tuple[tuple[str, int], ...]) -> frozenset[tuple[str, int, int] | None]:
    # every plan step is written as one binary operation (``steps_for``): None is never among them
    return frozenset(operation(lhs, dict(env)) for lhs, _ in _plan(expr, env))


def plan_operations(spec: dict[str, Any]) -> frozenset[tuple[str, int, int] | None]:
    """``operation`` of every step of the problem's expression, once per problem."""
    return _operations(spec["expr"], _env_key(spec))


@functools.lru_cache(maxsize=1024)
def _step_texts(expr: str, env: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """Every right step of the plan as written with literals, spaces left out: ``2-5=-3``, ``(-3)^2=9``, and
    both orders of a ``+`` or ``*`` (the orders ``operation`` takes as one step)."""
    out = set()
    for op, a, b in filter(None, _operations(expr, env)):
        for x, y in {(a, b), (b, a)} if op in "+*" else {(a, b)}:
            lhs = f"{_num(x)}{op}{_num(y)}"
            out.add(f"{lhs}={evaluate(lhs, {})}")
    return tuple(sorted(out))


class ArithTask(Task):
    name = "arith"
    checkers = {
        "arith_steps": "every step recomputed; the answer equals the last step",
        "arith_plan": "every step of the prompt's expression is among the written steps (a right sum of the wrong terms fails)",
    }

    def _random_expr(self, rng: random.Random) -> str:
        expr = rng.choice(SHAPES)
        for sym in "abc":
            expr = expr.replace(sym, rng.choice("xy"))
        while " o " in expr:
            expr = expr.replace(" o ", rng.choice("+-*"), 1)
        return expr

    def generate(self, rng: random.Random) -> Problem:
        while True:
            expr = rng.choice(TEMPLATES) if rng.random() < 0.5 else self._random_expr(rng)
            x, y = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
            if all(MIN_VALUE <= v <= MAX_VALUE for _, v in steps_for(expr, {"x": x, "y": y})):
                break
        prompt = f"If x={x} and y={y}, compute {expr}."
        return Problem(self.name, prompt, {"vars": {"x": x, "y": y}, "expr": expr})

    def parse_problem(self, prompt: str) -> dict[str, Any]:
        # whitespace collapsed first: the pattern's adjacent \s* then match one character at most,
        # so it runs in linear time (on raw runs of spaces it backtracked like their fourth power)
        m = _PROMPT_RE.match(" ".join(normalize(prompt).split()))
        if not m:
            raise InvalidArgument(
                "problem.prompt: not an arith problem; expected 'If x=<int> and y=<int>, compute <expr>.'"
            )
        env = {k: int(v) for k, v in _ASSIGN_RE.findall(m.group(1))}
        expr = m.group(2).replace(" ", "")
        if "**" in expr:
            raise InvalidArgument(f"problem.prompt: write powers as '^', not '**' in {expr!r}")
        try:
            evaluate(expr, env)
        except ValueError as exc:
            raise InvalidArgument(f"problem.prompt: bad expression {expr!r}: {exc}") from None
        if err := shape_error(_tree(expr)):
            raise InvalidArgument(f"problem.prompt: bad expression {expr[:80]!r}: {err}")
        return {"vars": env, "expr": expr}

    def solve(self, spec: dict[str, Any]) -> str:
        steps = plan_of(spec)
        body = "; ".join(f"{lhs}={v}" for lhs, v in steps)
        return f"{body}; answer {steps[-1][1]}" if steps else f"answer {evaluate(spec['expr'], spec['vars'])}"

    def parse_answer(self, text: str) -> Parsed:
        clean = " ".join(normalize(text).split())  # linear matching below (see parse_problem)
        steps = written_steps(clean)
        fields: dict[str, Any] = {"steps": steps}
        answers = _ANSWER_RE.findall(clean)
        if not answers:
            return Parsed(
                fields, "parse_error: no 'answer <int>' found" + (" (truncated?)" if clean.strip() else " (empty)")
            )
        fields["answer"] = int(answers[-1])
        return Parsed(fields)

    def check(self, checker: str, spec: dict[str, Any], parsed: Parsed) -> str:
        if checker == "arith_plan":
            return self._plan_error(spec, parsed)
        if checker != "arith_steps":
            raise InvalidArgument(
                f"rules.params.check: unknown checker {checker!r} for arith (known: {', '.join(self.checkers)})"
            )
        steps = parsed.fields.get("steps", [])
        for lhs, value in steps:
            try:
                expected = evaluate(lhs, spec["vars"])
            except ValueError as exc:
                return f"step_invalid: {lhs}={value} ({exc})"
            if expected != value:
                return f"step_wrong: {lhs}={value} (expected {expected})"
        if steps and parsed.fields.get("answer") != steps[-1][1]:
            return f"answer_mismatch: answer {parsed.fields.get('answer')} != last step {steps[-1][1]}"
        return ""

    @staticmethod
    def _plan_error(spec: dict[str, Any], parsed: Parsed) -> str:
        """The first step of the expression (post-order) whose value no written step reaches. With
        ``arith_steps`` (each written step right, the answer the last one) this checks the work is
        the prompt's: drafts that misread ``x*y`` as ``x+y`` compute correctly and pass that rule
        alone. Values, not text: a step may be written with the variables or in another order; counted,
        so that one ``1+1=2`` does not stand for both steps of ``x-(y+y)`` at x=4, y=1 (2, then 4-2=2);
        and the last written step must be the expression's last (later steps would change the answer)."""
        steps = parsed.fields.get("steps", [])
        written = Counter(v for _, v in steps)
        plan = plan_of(spec)
        for lhs, value in plan:
            if written[value] <= 0:
                return f"step_missing: no step computes {lhs}={value} of {spec['expr']}"
            written[value] -= 1
        if plan and steps[-1][1] != plan[-1][1]:
            return f"step_extra: {steps[-1][0]}={steps[-1][1]} after the expression's last step {plan[-1][0]}"
        return ""

    def step_ok(self, spec: dict[str, Any], step: str) -> bool:
        return self.step_error(spec, step) == ""

    def step_error(self, spec: dict[str, Any], step: str) -> str | None:
        m = _ONE_STEP_RE.fullmatch(" ".join(normalize(step).split()))
        if not m:
            return None
        lhs, value = m.group(1).replace(" ", ""), int(m.group(2))
        try:
            expected = evaluate(lhs, spec["vars"])
        except ValueError:
            return None
        if expected != value:
            return f"step_wrong: {lhs}={value} (expected {expected})"
        # a right sum of the wrong terms is no safe prefix: the cloud would continue the misreading. The value
        # alone is not enough: at x=3, y=0 drafts of y*(x-y) wrote "3-3=0; 0*0=0;", each step's value one of
        # the expression's (0), and the cloud, continuing them as a verified prefix, found no way to the
        # missing 3-0=3 (6 wrong split answers in 96 at 16 in flight). The step's last operation and its
        # operands' values must be one of the expression's steps (which makes its value one of theirs too).
        if operation(lhs, spec["vars"]) not in plan_operations(spec):
            return f"step_off_plan: {lhs}={value} computes no step of {spec['expr']}"
        return ""

    def step_completion(self, spec: dict[str, Any], partial: str) -> str | None:
        """The rest of the first plan step written with literals (``_step_texts``) that ``partial`` begins,
        spaces aside: ``2-5=`` -> ``-3``; a step written with the variables' names, or folding several,
        is judged only once it ends."""
        s = "".join(normalize(partial).split())
        if not s or len(partial) > MAX_PARTIAL_CHARS:
            return None
        return next((c[len(s) :] for c in _step_texts(spec["expr"], _env_key(spec)) if c.startswith(s)), None)

    def corrected_prefix(self, spec: dict[str, Any], text: str) -> str | None:
        """The first step that is no right step, where it is a step of this task's form with a wrong value,
        up to its ``=`` and the true value (``evaluate``: parentheses, powers and negative operands, which
        the text calculator does not read: ``6-(-3)=6`` becomes ``6-(-3)=9``); else the text calculator's
        (``Task.corrected_prefix``). The step's terms stay the model's."""
        start = 0
        for part in _PARTS_RE.split(text):
            if part.strip() and part not in (";", "\n"):
                if part.strip().lower().startswith("answer"):
                    break
                err = self.step_error(spec, part)
                if err is not None and err.startswith("step_wrong"):
                    m = _ONE_STEP_RE.fullmatch(" ".join(normalize(part).split()))
                    assert m is not None  # a step of the task's form: step_error read it
                    eq = part.rindex("=") + 1
                    space = part[eq : len(part) - len(part[eq:].lstrip())]
                    return text[:start] + part[:eq] + space + str(evaluate(m.group(1).replace(" ", ""), spec["vars"]))
                if err != "":  # no step of this form, or right terms off the plan: no value to correct here
                    break
            start += len(part)
        return super().corrected_prefix(spec, text)

    def repaired(self, spec: dict[str, Any], text: str) -> str | None:
        """Every step's value recomputed in place, as a calculator would have written it, and carried to
        where the draft used it: a literal in a later step that is an earlier step's wrong value becomes
        that step's true value where the step then computes one of the expression's steps
        (``8-7=2; 2^2=4; ...`` -> ``8-7=1; 1^2=1; ...``), and an answer that was the last step's value
        becomes its true value. The operations and their order stay the model's: a draft that computes
        the wrong terms still fails ``arith_plan`` once repaired. A part that is no step of the form
        (prose, an unparsable step) and all after the answer stay as written."""
        env, plan = spec["vars"], plan_operations(spec)
        latest: dict[int, int] = {}  # value as written -> true value, of the latest repaired step that wrote it
        last: tuple[int, int] | None = None  # the last step's (value as written, true value)
        parts = _PARTS_RE.split(text)
        for i, part in enumerate(parts):
            if part.strip().lower().startswith("answer"):
                m = _ANSWER_RE.search(part)
                if m and last is not None and int(m.group(1)) == last[0]:
                    parts[i] = part[: m.start(1)] + str(last[1]) + part[m.end(1) :]
                break
            step = self._repaired_step(part, env, plan, latest) if "=" in part else None
            if step is not None:
                parts[i], written, true = step
                last = (written, true)
                if written != true:
                    latest[written] = true
        out = "".join(parts)
        return out if out != text else None

    @staticmethod
    def _repaired_step(
        part: str, env: dict[str, int], plan: frozenset, latest: dict[int, int]
    ) -> tuple[str, int, int] | None:
        """``part`` repaired (``repaired``): (its text, its value as written, its true value); None when it
        is no step of the form. Its literals are tried as an earlier repaired step's true value (the most
        recent: a draft uses the step it just wrote; one candidate each keeps the variants at 2^n), then as
        written; the first that computes one of the expression's steps is kept, else the step as written."""
        m = _ONE_STEP_RE.fullmatch(" ".join(normalize(part).split()))
        if not m:
            return None
        raw, written = part[: part.rfind("=")], int(m.group(2))
        literals = list(_LITERAL_RE.finditer(raw))
        options = [[latest[v], None] if (v := int(lit.group().strip("()"))) in latest else [None] for lit in literals]
        lhs = raw
        if len(literals) <= MAX_REPAIRED_LITERALS and any(len(o) > 1 for o in options):
            for choice in itertools.product(*options):
                if all(c is None for c in choice):
                    break  # as written: the last variant
                v = raw
                for lit, c in reversed(list(zip(literals, choice))):
                    if c is not None:
                        v = v[: lit.start()] + _num(c) + v[lit.end() :]
                if ArithTask._on_plan(v, env, plan):
                    lhs = v
                    break
        try:
            true = evaluate(lhs.replace(" ", ""), env)
        except ValueError:
            return None
        fixed = _with_value(part, true, lhs)
        return None if fixed is None else (fixed[0] + fixed[1], written, true)

    @staticmethod
    def _on_plan(lhs: str, env: dict[str, int], plan: frozenset) -> bool:
        try:
            return operation(lhs.replace(" ", ""), env) in plan
        except ValueError:
            return False

    def grade(self, spec: dict[str, Any], parsed: Parsed) -> bool:
        return parsed.ok and parsed.fields.get("answer") == evaluate(spec["expr"], spec["vars"])

    def default_rules(self, spec: dict[str, Any]) -> list[Rule]:
        return [
            Rule("task_check", {"check": "arith_steps"}),
            Rule("task_check", {"check": "arith_plan"}),
            Rule("numeric_bounds", {"field": "answer", "min": -1e9, "max": 1e9}),
            Rule("length", {"max": 512}),
        ]

    def structure_key(self, parsed: Parsed) -> tuple:
        return (tuple(parsed.fields.get("steps", [])), parsed.fields.get("answer"))
