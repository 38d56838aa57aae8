"""Declarative rules: data that travels with a request, checked exactly and fast.

A rule is ``(kind, params, name)``. Kinds:

==============  ============================================  ===========================
kind            params                                        error on failure
==============  ============================================  ===========================
json_schema     schema: JSON Schema of the parsed answer      schema_violation: <path>: <msg>
numeric_bounds  field, min?, max?                             out_of_bounds: answer=1200 > 1000
membership      field, values: allowed list                   not_member: ids has 'E' (allowed: A,B)
count           field, min?, max?, unique? (default false)    count_wrong: ids has 3 (expected 2..2)
length          min?, max?  (characters of the draft text)    too_long: 600 chars > 512
regex           pattern, must_match? (default true)           regex_failed: ...
arithmetic      (none): every ``a op b = c`` in the text          arithmetic_wrong: 48 / 2 = 25 (expected 24)
task_check      check: a checker name offered by the task     the checker's own error
==============  ============================================  ===========================

Rules run on the *extracted* answer (``Parsed.fields``; ``field`` is a key of it),
except ``length``, ``regex`` and ``arithmetic`` which run on the raw text. The extraction
itself is an implicit first rule (``parse``): the request's declared extraction
(``coinfer.extract``), else the task preset's own parser; a draft it cannot parse fails with
``parse_error: ...`` before any other rule runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema
import regex

from coinfer import userregex
from coinfer.arithmetic import first_wrong_equation
from coinfer.errors import InvalidArgument, require
from coinfer.extract import Extraction

if TYPE_CHECKING:
    from coinfer.tasks.base import Parsed, Task

RULE_KINDS = ("json_schema", "numeric_bounds", "membership", "count", "length", "regex", "arithmetic", "task_check")
MAX_PATTERN = 512  # a regex rule is user input: bound it (catastrophic backtracking)


@dataclass(frozen=True)
class Rule:
    """One declarative rule as it travels with a request."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or (f"{self.kind}:{self.params['check']}" if self.kind == "task_check" else self.kind)


@dataclass
class RuleResult:
    """Outcome of running a rule set on one draft."""

    valid: bool
    error: str = ""
    failed_rule: str = ""
    passed: list[str] = field(default_factory=list)


def _num(params: Mapping[str, Any], key: str, where: str) -> float | None:
    v = params.get(key)
    if v is None:
        return None
    require(isinstance(v, (int, float)) and not isinstance(v, bool), f"{where}.{key}", f"must be a number, got {v!r}")
    return float(v)


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


class CompiledRule:
    """A validated rule, ready to run. Construction raises InvalidArgument naming the bad param."""

    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], where: str) -> None:
        if rule.kind not in RULE_KINDS:
            raise InvalidArgument(f"{where}.kind: unknown rule kind {rule.kind!r} (known: {', '.join(RULE_KINDS)})")
        self.rule, self.task, self.spec = rule, task, spec
        p, w = rule.params, f"{where}.params"
        self.field = p.get("field")
        if rule.kind in ("numeric_bounds", "membership", "count"):
            require(isinstance(self.field, str) and self.field != "", f"{w}.field", "required string")
        if rule.kind in ("numeric_bounds", "count", "length"):
            self.lo, self.hi = _num(p, "min", w), _num(p, "max", w)
            require(self.lo is not None or self.hi is not None, w, "needs min or max")
            if self.lo is not None and self.hi is not None:
                require(self.lo <= self.hi, f"{w}.min", f"{_fmt(self.lo)} > max {_fmt(self.hi)}")
        if rule.kind == "count":
            self.unique = bool(p.get("unique", False))
        elif rule.kind == "membership":
            values = p.get("values")
            require(isinstance(values, Sequence) and not isinstance(values, str), f"{w}.values", "required list")
            self.allowed = [str(v) for v in values]
        elif rule.kind == "regex":
            pattern = p.get("pattern")
            require(isinstance(pattern, str) and 0 < len(pattern) <= MAX_PATTERN, f"{w}.pattern",
                    f"required string of 1..{MAX_PATTERN} chars")
            try:
                self.regex = userregex.compile(pattern)
            except regex.error as exc:
                raise InvalidArgument(f"{w}.pattern: invalid regex: {exc}") from None
            self.must_match = bool(p.get("must_match", True))
        elif rule.kind == "json_schema":
            schema = p.get("schema")
            require(isinstance(schema, Mapping), f"{w}.schema", "required object")
            try:
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise InvalidArgument(f"{w}.schema: invalid JSON Schema: {exc.message}") from None
            self.validator = cls(schema)
        elif rule.kind == "task_check":
            check = p.get("check")
            require(check in task.checkers, f"{w}.check",
                    f"unknown checker {check!r} for task {task.name} (known: {', '.join(task.checkers)})")
            self.check_name = check

    def __call__(self, text: str, parsed: Parsed) -> str:
        """'' if the rule passes, else its precise error."""
        kind, f = self.rule.kind, self.field
        if kind == "length":
            n = len(text)
            if self.hi is not None and n > self.hi:
                return f"too_long: {n} chars > {_fmt(self.hi)}"
            if self.lo is not None and n < self.lo:
                return f"too_short: {n} chars < {_fmt(self.lo)}"
            return ""
        if kind == "regex":
            try:
                found = userregex.search(self.regex, text) is not None
            except userregex.RegexTimeout as exc:
                return f"regex_timeout: {exc} on this text"
            if found != self.must_match:
                return f"regex_failed: {'no match for' if self.must_match else 'forbidden match of'} /{self.regex.pattern}/"
            return ""
        if kind == "arithmetic":
            return first_wrong_equation(text)
        if kind == "task_check":
            return self.task.check(self.check_name, self.spec, parsed)
        if kind == "json_schema":
            err = jsonschema.exceptions.best_match(self.validator.iter_errors(_jsonable(parsed.fields)))
            if err is None:
                return ""
            path = "/".join(str(x) for x in err.absolute_path) or "<root>"
            return f"schema_violation: {path}: {err.message}"
        if f not in parsed.fields:
            return f"missing_field: {f}"
        value = parsed.fields[f]
        if kind == "numeric_bounds":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return f"not_a_number: {f}={value!r}"
            if self.hi is not None and value > self.hi:
                return f"out_of_bounds: {f}={_fmt(value)} > {_fmt(self.hi)}"
            if self.lo is not None and value < self.lo:
                return f"out_of_bounds: {f}={_fmt(value)} < {_fmt(self.lo)}"
            return ""
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if kind == "membership":
            for v in items:
                if str(v) not in self.allowed:
                    return f"not_member: {f} has {str(v)!r} (allowed: {','.join(self.allowed)})"
            return ""
        # count
        n = len(items)
        if self.unique:
            seen: set[str] = set()
            for v in items:
                if str(v) in seen:
                    return f"duplicate: {f} has {str(v)!r} twice"
                seen.add(str(v))
        lo = _fmt(self.lo) if self.lo is not None else "0"
        hi = _fmt(self.hi) if self.hi is not None else "inf"
        if (self.lo is not None and n < self.lo) or (self.hi is not None and n > self.hi):
            return f"count_wrong: {f} has {n} (expected {lo}..{hi})"
        return ""


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


class RuleSet:
    """The compiled rules of one request, bound to its task and problem spec."""

    def __init__(self, rules: Sequence[Rule], task: Task, spec: dict[str, Any], where: str = "problem.rules",
                 extraction: Extraction | None = None) -> None:
        rules = list(rules) or task.default_rules(spec)
        self.task, self.spec = task, spec
        self.extraction = extraction or Extraction()
        self.extraction.validate("problem.extraction")
        self.rules = [CompiledRule(r, task, spec, f"{where}[{i}]") for i, r in enumerate(rules)]

    def parse(self, text: str) -> Parsed:
        """The declared extraction, else the task preset's own parser."""
        return self.extraction(text) if self.extraction.kind else self.task.parse_answer(text)

    @property
    def labels(self) -> list[str]:
        return [c.rule.label for c in self.rules]

    def check(self, text: str, parsed: Parsed | None = None) -> tuple[RuleResult, Parsed]:
        """Parse (unless given) and run every rule in order; stop at the first failure."""
        parsed = parsed if parsed is not None else self.parse(text)
        if not parsed.ok:
            return RuleResult(False, parsed.error, "parse"), parsed
        passed = ["parse"]
        for c in self.rules:
            err = c(text, parsed)
            if err:
                return RuleResult(False, err, c.rule.label, passed), parsed
            passed.append(c.rule.label)
        return RuleResult(True, passed=passed), parsed
