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

A ``json_schema`` rule is the client's program: it runs within a time budget (``SCHEMA_BUDGET_S``:
``anyOf`` over ``$ref``s nests into exponential work in a few hundred bytes), its ``pattern``s are
client regexes (``coinfer.userregex``), ``uniqueItems`` takes linear time, and ``patternProperties`` is
refused (jsonschema matches those with ``re``, which backtracks without bound). Any rule's params hold
at most ``MAX_PARAMS_NODES`` values nested at most ``MAX_PARAMS_DEPTH`` levels.

Rules run on the *extracted* answer (``Parsed.fields``; ``field`` is a key of it),
except ``length``, ``regex`` and ``arithmetic`` which run on the raw text. The extraction
itself is an implicit first rule (``parse``): the request's declared extraction
(``coinfer.extract``), else the task preset's own parser; a draft it cannot parse fails with
``parse_error: ...`` before any other rule runs.

What a prefix can tell (``judges_prefix``; docs/api.md, Streaming). The cloud streams an answer as
final step by step only where every check of the request can judge a *prefix*: a rule's verdict on a
prefix is its verdict on that part of every answer that begins with it (what fails there fails the
whole; what passes there no continuation makes fail). Such a prefix is judged where a step ends (``step_ends``: a line, a ``;``, a sentence's ``.``/``!``/``?`` before a space):

- ``arithmetic``: an equation is complete once a step ends after it (a step's end breaks every chain
  of numbers), and a wrong one stays wrong.
- ``regex`` with ``must_match: false``: a forbidden match in a prefix is a match in the whole, where
  the pattern cannot look past the prefix's end: a pattern with ``$``, ``\\Z``, ``\\z``, a word
  boundary (``\\b``, ``\\B``, ``\\m``, ``\\M``) or a lookahead (``(?=``, ``(?!``) could match there and not
  in the whole, or the reverse, so it judges only the whole (``end_sensitive``; conservative: an
  escaped ``\\$`` counts too).
- ``length`` with only a ``max``: a prefix over it is over it for good; the cloud stops there.

Only the whole answer can satisfy the rest: ``json_schema``, ``numeric_bounds``, ``membership``,
``count`` and ``task_check`` (over extracted fields), ``regex`` with ``must_match`` (the match may come
later), ``length`` with a ``min``, and the extraction itself (an open request's extraction ``none``
cannot fail; a preset's parser and any other extraction need the answer's end).

Of those, some read only what the answer's *end* can still change (``end_decides``): the rules over
extracted fields, a preset's checkers (its steps are judged one by one, ``Task.prefix_error``, and a
prefix of right steps can always be finished), a ``length``. Where every rule judges a prefix or only
the end decides it, and the end is known when it begins (a preset's ``answer ...``, a ``marker``
extraction's marker), the cloud streams the steps before the end as final and holds the end until the
whole answer passes (``streams_steps``). A ``regex`` that must match is neither: a prefix already shown
(``^\\d+$``) may leave no end that matches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema
import referencing.exceptions
import regex

from coinfer import userregex
from coinfer.arithmetic import first_wrong_equation
from coinfer.errors import InvalidArgument, require
from coinfer.extract import DEFAULT_MARKER, MAX_DIGITS, Extraction, Parsed, json_shape, long_number
from coinfer.repetition import repetition_error
from coinfer.rulespec import RULE_KINDS, Rule
from coinfer.schema_budget import SCHEMA_BUDGET_S, SchemaTimeout, bounded, objects, schema_budget
from coinfer.steps import end_sensitive, open_step_shown
from coinfer.text import normalize

if TYPE_CHECKING:
    from coinfer.tasks.base import Task

MAX_PATTERN = 512  # a regex rule is user input: bound it (catastrophic backtracking)
MAX_PARAMS_DEPTH = 32
"""Deepest rule params (a JSON Schema's nesting): validation recurses per level, and a schema nested
3,000 deep recursed past Python's limit (RecursionError, an INTERNAL answer)."""
MAX_PARAMS_NODES = 4096
"""Most values in one rule's params: what compiling them costs (a schema's check against its metaschema
takes up to milliseconds per subschema) stays bounded."""
MAX_PARAMS_BYTES = 64 << 10
"""Most serialised bytes of one rule's params on the wire (checked before they are converted)."""


@dataclass(kw_only=True)
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
    require(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        f"{where}.{key}",
        f"must be a finite number, got {v!r}",
    )
    return float(v)


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


class _Rule:
    """A compiled rule of one kind: built from its params (InvalidArgument naming the bad one), then
    called on a draft's text and parsed fields: '' when it passes, else its precise error.
    ``judges_prefix``: called on a prefix that ends a step (``step_ends``), with nothing extracted, its
    verdict is the whole answer's (the module docstring says which). ``end_decides``: it reads only what
    an answer's held end can still change (the extracted fields, the length's minimum), so whatever a
    prefix of right steps says, some end passes it."""

    judges_prefix = False
    end_decides = False

    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        self.rule, self.task, self.spec = rule, task, spec

    def __call__(self, text: str, parsed: Parsed) -> str:
        raise NotImplementedError


_KINDS: dict[str, type[_Rule]] = {}


def _kind(name: str):
    def register(cls: type[_Rule]) -> type[_Rule]:
        _KINDS[name] = cls
        return cls

    return register


class _Bounds:
    """``min`` / ``max`` params: at least one, in order."""

    def _bounds(self, p: Mapping[str, Any], w: str) -> None:
        self.lo, self.hi = _num(p, "min", w), _num(p, "max", w)
        require(self.lo is not None or self.hi is not None, w, "needs min or max")
        if self.lo is not None and self.hi is not None:
            require(self.lo <= self.hi, f"{w}.min", f"{_fmt(self.lo)} > max {_fmt(self.hi)}")


@_kind("length")
class _Length(_Rule, _Bounds):
    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        self._bounds(rule.params, w)
        self.judges_prefix = self.lo is None  # too long stays too long; too short may yet grow
        self.end_decides = True

    def __call__(self, text: str, parsed: Parsed) -> str:
        n = len(text)
        if self.hi is not None and n > self.hi:
            return f"too_long: {n} chars > {_fmt(self.hi)}"
        if self.lo is not None and n < self.lo:
            return f"too_short: {n} chars < {_fmt(self.lo)}"
        return ""


@_kind("regex")
class _Regex(_Rule):
    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        pattern = rule.params.get("pattern")
        require(
            isinstance(pattern, str) and 0 < len(pattern) <= MAX_PATTERN,
            f"{w}.pattern",
            f"required string of 1..{MAX_PATTERN} chars",
        )
        try:
            self.regex = userregex.compile(pattern)
        except regex.error as exc:
            raise InvalidArgument(f"{w}.pattern: invalid regex: {exc}") from None
        self.must_match = bool(rule.params.get("must_match", True))
        self.judges_prefix = not self.must_match and not end_sensitive(pattern)

    def __call__(self, text: str, parsed: Parsed) -> str:
        try:
            found = userregex.search(self.regex, text) is not None
        except userregex.RegexTimeout as exc:
            return f"regex_timeout: {exc} on this text"
        if found != self.must_match:
            return f"regex_failed: {'no match for' if self.must_match else 'forbidden match of'} /{self.regex.pattern}/"
        return ""


@_kind("arithmetic")
class _Arithmetic(_Rule):
    judges_prefix = True

    def __call__(self, text: str, parsed: Parsed) -> str:
        return first_wrong_equation(text)


@_kind("task_check")
class _TaskCheck(_Rule):
    end_decides = True  # the task's steps are judged one by one (``Task.prefix_error``), its answer at the end

    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        check = rule.params.get("check")
        require(
            check in task.checkers,
            f"{w}.check",
            f"unknown checker {check!r} for task {task.name} (known: {', '.join(task.checkers)})",
        )
        self.check_name = check

    def __call__(self, text: str, parsed: Parsed) -> str:
        return self.task.check(self.check_name, self.spec, parsed)


@_kind("json_schema")
class _JsonSchema(_Rule):
    end_decides = True  # it runs on the extracted fields

    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        schema = rule.params.get("schema")
        require(isinstance(schema, Mapping), f"{w}.schema", "required object")
        require(
            not any("patternProperties" in o for o in objects(schema)),
            f"{w}.schema",
            "patternProperties is not supported (its regexes would run without a time budget)",
        )
        cls = jsonschema.validators.validator_for(schema)
        # cls.check_schema, with the metaschema's keywords timed
        meta = bounded(jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls))
        try:
            with schema_budget():
                for error in meta(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER).iter_errors(schema):
                    raise InvalidArgument(f"{w}.schema: invalid JSON Schema: {error.message}")
            for o in objects(schema):
                if isinstance(o.get("pattern"), str):
                    userregex.compile(o["pattern"])
        except (SchemaTimeout, userregex.RegexTimeout):
            raise InvalidArgument(
                f"{w}.schema: too large: checking it took over {SCHEMA_BUDGET_S * 1e3:.0f} ms"
            ) from None
        except regex.error as exc:
            raise InvalidArgument(f"{w}.schema: invalid pattern: {exc}") from None
        self.validator = bounded(cls)(schema)

    def __call__(self, text: str, parsed: Parsed) -> str:
        try:
            with schema_budget():
                err = jsonschema.exceptions.best_match(self.validator.iter_errors(_jsonable(parsed.fields)))
        except (SchemaTimeout, userregex.RegexTimeout):
            return f"schema_timeout: the schema took over {SCHEMA_BUDGET_S * 1e3:.0f} ms on this text"
        except RecursionError:  # a $ref cycle that consumes nothing ({"$ref": "#"})
            return "schema_error: the schema refers to itself without end"
        except referencing.exceptions.Unresolvable as exc:  # remote (never fetched) or missing
            return f"schema_error: unresolvable $ref {exc.ref!r}"
        if err is None:
            return ""
        path = "/".join(str(x) for x in err.absolute_path) or "<root>"
        return f"schema_violation: {path}: {err.message}"


class _FieldRule(_Rule):
    """A rule on one extracted field (``field``): missing_field when the draft has none."""

    end_decides = True

    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        self.field = rule.params.get("field")
        require(isinstance(self.field, str) and self.field != "", f"{w}.field", "required string")

    def __call__(self, text: str, parsed: Parsed) -> str:
        if self.field not in parsed.fields:
            return f"missing_field: {self.field}"
        return self.check(self.field, parsed.fields[self.field])

    def check(self, f: str, value: Any) -> str:
        raise NotImplementedError


@_kind("numeric_bounds")
class _NumericBounds(_FieldRule, _Bounds):
    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        self._bounds(rule.params, w)

    def check(self, f: str, value: Any) -> str:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"not_a_number: {f}={value!r}"
        if self.hi is not None and value > self.hi:
            return f"out_of_bounds: {f}={_fmt(value)} > {_fmt(self.hi)}"
        if self.lo is not None and value < self.lo:
            return f"out_of_bounds: {f}={_fmt(value)} < {_fmt(self.lo)}"
        return ""


def _items(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


@_kind("membership")
class _Membership(_FieldRule):
    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        values = rule.params.get("values")
        require(isinstance(values, Sequence) and not isinstance(values, str), f"{w}.values", "required list")
        self.allowed = [str(v) for v in values]

    def check(self, f: str, value: Any) -> str:
        for v in _items(value):
            if str(v) not in self.allowed:
                return f"not_member: {f} has {str(v)!r} (allowed: {','.join(self.allowed)})"
        return ""


@_kind("count")
class _Count(_FieldRule, _Bounds):
    def __init__(self, rule: Rule, task: Task, spec: dict[str, Any], w: str) -> None:
        super().__init__(rule, task, spec, w)
        self._bounds(rule.params, w)
        self.unique = bool(rule.params.get("unique", False))

    def check(self, f: str, value: Any) -> str:
        items = _items(value)
        if self.unique:
            seen: set[str] = set()
            for v in items:
                if str(v) in seen:
                    return f"duplicate: {f} has {str(v)!r} twice"
                seen.add(str(v))
        n = len(items)
        if (self.lo is not None and n < self.lo) or (self.hi is not None and n > self.hi):
            lo = _fmt(self.lo) if self.lo is not None else "0"
            hi = _fmt(self.hi) if self.hi is not None else "inf"
            return f"count_wrong: {f} has {n} (expected {lo}..{hi})"
        return ""


assert tuple(sorted(_KINDS)) == tuple(sorted(RULE_KINDS)), "every rule kind has its class"


def compile_rule(rule: Rule, task: Task, spec: dict[str, Any], where: str) -> _Rule:
    """A validated rule, ready to run. Raises InvalidArgument naming the bad param."""
    if rule.kind not in _KINDS:
        raise InvalidArgument(f"{where}.kind: unknown rule kind {rule.kind!r} (known: {', '.join(RULE_KINDS)})")
    w = f"{where}.params"
    depth, nodes = json_shape(dict(rule.params), MAX_PARAMS_NODES)
    require(
        depth <= MAX_PARAMS_DEPTH and nodes <= MAX_PARAMS_NODES,
        w,
        f"at most {MAX_PARAMS_NODES} values nested at most {MAX_PARAMS_DEPTH} levels deep",
    )
    return _KINDS[rule.kind](rule, task, spec, w)


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


_NOTHING = Parsed({})
"""What an open request with extraction ``none`` extracts: nothing (the prefix rules run on the text)."""


class RuleSet:
    """The compiled rules of one request, bound to its task and problem spec."""

    def __init__(
        self,
        rules: Sequence[Rule],
        task: Task,
        spec: dict[str, Any],
        where: str = "problem.rules",
        extraction: Extraction | None = None,
    ) -> None:
        self.exact = not rules and bool(task.name)
        """The preset's own checkers are in force (the request named no rules of its own): they grade an
        answer exactly against the problem (``Task.default_rules``), so an answer that passes them is right."""
        self.own = not rules and not (extraction and extraction.kind)
        """Every check is the project's own code, linear in the text (no client pattern, schema or extraction,
        whose cost the client sets): a small text is checked on the event loop (``coinfer.serving.offload``)."""
        rules = list(rules) or task.default_rules(spec)
        self.task, self.spec = task, spec
        self.extraction = extraction or Extraction()
        self.extraction.validate("problem.extraction")
        self.rules = [compile_rule(r, task, spec, f"{where}[{i}]") for i, r in enumerate(rules)]

    def parse(self, text: str) -> Parsed:
        """The declared extraction, else the task preset's own parser. A draft is client text: the presets'
        parsers call int() on its digit runs (ValueError past 4,300 digits) and select's reads JSON in it
        (RecursionError past ~1,000 nested brackets); either is a parse error here, never an exception."""
        if self.extraction.kind:
            return self.extraction(text)
        if self.task.name and long_number(text):
            return Parsed({}, f"parse_error: a number of over {MAX_DIGITS} digits")
        try:
            return self.task.parse_answer(text)
        except RecursionError:
            return Parsed({}, "parse_error: nested too deeply")

    @property
    def labels(self) -> list[str]:
        return [c.rule.label for c in self.rules]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of the rules in force, sorted, once each: a closed set (``RULE_KINDS``), unlike the names a
        client may give its rules (what the cloud may key a table by)."""
        return tuple(sorted({c.rule.kind for c in self.rules}))

    @property
    def judges_prefix(self) -> bool:
        """Every check can judge a prefix that ends a step (the module docstring): an open request whose
        extraction (``none``) cannot fail, every rule one that ``judges_prefix``. The cloud's own answer
        then streams as final step by step, each step checked first (``prefix_error``; docs/api.md,
        Streaming)."""
        return (
            not self.task.name
            and (self.extraction.kind or "none") == "none"
            and all(c.judges_prefix for c in self.rules)
        )

    @property
    def streams_steps(self) -> bool:
        """The cloud's own answer streams as final step by step, its end held where it has one
        (``prefix_error``; docs/api.md, Streaming): where every check judges a prefix
        (``judges_prefix``), or a rule that only the end can satisfy reads only what the end can still
        change (``end_decides``) and the answer's end is known when it begins: a preset's steps, each
        judged by the task (``Task.prefix_error``), before its ``answer ...``; an open request's text
        before its extraction's marker (``Answer:``)."""
        if self.judges_prefix:
            return True
        if not all(c.judges_prefix or c.end_decides for c in self.rules):
            return False
        return not self.extraction.kind if self.task.name else self.extraction.kind == "marker"

    def check_size(self, text: str) -> int | None:
        """What a check of ``text`` costs, for ``coinfer.serving.offload.run_sized``: its length where the
        rules are our own, None (no bound: a worker thread) where the client's are in force."""
        return len(text) if self.own else None

    @property
    def only_loop_watch(self) -> bool:
        """Nothing but the built-in repetition check can refuse an answer (no rules, and nothing to
        extract): no check waits for a step to end either, so the cloud's own answer can stream as final
        token by token (docs/api.md, Streaming)."""
        return self.judges_prefix and not self.rules

    @property
    def max_chars(self) -> float:
        """The most characters an answer may have (the least ``max`` of the ``length`` rules; inf: none)."""
        return min((c.hi for c in self.rules if isinstance(c, _Length) and c.hi is not None), default=math.inf)

    def prefix_error(self, text: str) -> str | None:
        """Why a prefix that ends a step (``step_ends``) fails, as ``RuleResult``'s ``"<rule>: <error>"``
        ('' when it passes: whatever follows, the whole answer's verdict on it is the same); only where
        ``streams_steps``. None where the answer's end has begun (a preset's ``answer ...`` or a part that
        is no step of it; an open request's marker): that part and the rest are judged whole."""
        for c in self.rules:
            if c.judges_prefix and (err := c(text, _NOTHING)):
                return f"{c.rule.label}: {err}"
        if self.judges_prefix:
            return ""
        if self.task.name:
            err = self.task.prefix_error(self.spec, text)
            return f"{self.task.name}: {err}" if err else err
        return None if (self.extraction.marker or DEFAULT_MARKER) in normalize(text) else ""

    def step_completion(self, partial: str) -> str | None:
        """``Task.step_completion``: what ends ``partial``, the beginning of a step, as a right step of the
        task; only where the preset's exact checkers are in force (``exact``): a client's own rule could
        refuse what the calculator would write, and only a preset's steps have one."""
        return self.task.step_completion(self.spec, partial) if self.exact else None

    def step_shown(self, partial: str) -> int | None:
        """How many characters of ``partial`` -- the beginning of a step, no step's end in it -- may
        stream before the step ends (``coinfer.steps``; docs/api.md, Streaming); None: no more of it
        until it ends. A preset under its own checkers: all of it while the calculator can end it
        (``step_completion``). Open text whose only prefix rule is ``arithmetic`` (the others read only
        the end) and whose extraction is ``none`` or ``marker``: up to where its chains of numbers are
        complete and right, short of the marker. Anything else: None (steps stream whole)."""
        if self.exact:
            return len(partial) if self.step_completion(partial) is not None else None
        marker = self._open_growth_marker
        return None if marker is None else open_step_shown(partial, marker)

    @functools.cached_property
    def _open_growth_marker(self) -> str | None:
        """Where open text grows (``step_shown``), the marker its growth stops short of ('' for extraction
        ``none``); None where it does not. Derived once per request: ``step_shown`` runs per token."""
        kind = self.extraction.kind or "none"
        if self.task.name or kind not in ("none", "marker"):
            return None
        if not all(isinstance(c, _Arithmetic) or (c.end_decides and not c.judges_prefix) for c in self.rules):
            return None
        return (self.extraction.marker or DEFAULT_MARKER) if kind == "marker" else ""

    def check(self, text: str, parsed: Parsed | None = None) -> tuple[RuleResult, Parsed]:
        """Parse (unless given), reject degenerate repetition (``coinfer.repetition``: built in, every
        request), then run every rule in order; stop at the first failure."""
        parsed = parsed if parsed is not None else self.parse(text)
        if not parsed.ok:
            return RuleResult(valid=False, error=parsed.error, failed_rule="parse"), parsed
        if loop := repetition_error(text):
            return RuleResult(valid=False, error=loop, failed_rule="repetition", passed=["parse"]), parsed
        passed = ["parse"]
        for c in self.rules:
            err = c(text, parsed)
            if err:
                return RuleResult(valid=False, error=err, failed_rule=c.rule.label, passed=passed), parsed
            passed.append(c.rule.label)
        return RuleResult(valid=True, passed=passed), parsed

    def check_repaired(self, text: str) -> tuple[RuleResult, Parsed, str, str]:
        """``check``, and where ``text`` fails it, ``check`` of its calculator repair (``repaired``:
        computed values rewritten in place, the model's choices kept): (the verdict, what was extracted,
        the text judged, why ``text`` as written failed where its repair passed; '' when judged as written)."""
        res, parsed = self.check(text)
        if res.valid or (fixed := self.repaired(text)) is None:
            return res, parsed, text, ""
        res2, parsed2 = self.check(fixed)
        if not res2.valid:
            return res, parsed, text, ""
        return res2, parsed2, fixed, f"{res.failed_rule}: {res.error}"

    @functools.cached_property
    def repairs_equations(self) -> bool:
        """An open request under the ``arithmetic`` rule: a draft that fails the rules is judged again with
        its equations' results recomputed and carried (``coinfer.arithmetic.repaired``). The rule already
        says what each equation computes; which operations the draft chose is the LLM verifier's to judge,
        as for any open draft (a repaired draft is held to the absolute likelihood threshold)."""
        return not self.task.name and any(c.rule.kind == "arithmetic" for c in self.rules)

    def repaired(self, text: str) -> str | None:
        """``text`` repaired by the task's calculator (``Task.repaired``): a preset's under its exact checkers
        (only they vouch for what the draft model did not write where the rules decide alone); an open text's
        equations under the ``arithmetic`` rule (``repairs_equations``); None: no repair here, nothing to
        change, or a number too long to compute (``long_number``). Whether the repair passes the rules is
        ``check_repaired``'s to say."""
        if long_number(text) or not (self.exact or self.repairs_equations):
            return None
        return self.task.repaired(self.spec, text)


def request_check_size(req: Any) -> int | None:
    """What checking a request costs, for ``coinfer.serving.offload.run_sized`` (the cloud's ``OpenRequest``, the
    edge's ``SolveRequest``: its ``prompt``, ``messages``, ``rules``, ``extraction``): its question's characters
    (and turns) where it names no rules or extraction of its own; None where it does (a client's schema or
    pattern compiles at a cost the client sets: always in a worker thread)."""
    if req.rules or req.extraction.kind:
        return None
    return len(req.prompt) + sum(len(m.content) + 1 for m in req.messages)
