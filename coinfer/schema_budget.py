"""A client's JSON Schema run in bounded time: the ``json_schema`` rule's engine (``coinfer.rules``).

jsonschema as it ships runs a client's schema without bound: ``anyOf`` over ``$ref``s nests into exponential
work in a few hundred bytes, ``pattern`` uses ``re`` (unbounded backtracking), ``uniqueItems`` compares
unsortable items pairwise. ``bounded`` extends a validator class so that every keyword's check runs behind
one clock (``schema_budget``: ``SCHEMA_BUDGET_S``), patterns run as client regexes (``coinfer.userregex``)
and ``uniqueItems`` takes linear time.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema

from coinfer import userregex

SCHEMA_BUDGET_S = 0.02
"""Most time one client JSON Schema may take to be checked, and to run on one draft (as a client regex:
``userregex.BUDGET_S``)."""


class SchemaTimeout(Exception):
    """A JSON Schema ran past ``SCHEMA_BUDGET_S`` on this draft."""


_schema_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("schema_deadline", default=math.inf)


def _timed(keyword: Any) -> Any:
    """A keyword's check behind the budget's clock: every nested check passes through one."""

    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if time.perf_counter() > _schema_deadline.get():
            raise SchemaTimeout
        return keyword(validator, value, instance, schema)

    return check


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` as a client regex (time budget), not ``re``'s unbounded backtracking."""
    if validator.is_type(instance, "string") and userregex.search(userregex.compile(pattern), instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _canonical(v: Any) -> Any:
    """What ``uniqueItems`` compares: 1 equals 1.0, true is not 1, key order does not count."""
    if isinstance(v, Mapping):
        return {str(k): _canonical(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    """``uniqueItems`` in linear time (jsonschema compares unsortable items pairwise: 15 s for 1,300 objects)."""
    if unique and validator.is_type(instance, "array"):
        seen: set[str] = set()
        for item in instance:
            key = json.dumps(_canonical(item), sort_keys=True)
            if key in seen:
                yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


@contextlib.contextmanager
def schema_budget() -> Iterator[None]:
    deadline = _schema_deadline.set(time.perf_counter() + SCHEMA_BUDGET_S)
    try:
        yield
    finally:
        _schema_deadline.reset(deadline)


@functools.cache
def bounded(cls: type) -> type:
    """The validator class ``cls`` with client patterns, linear ``uniqueItems`` and every keyword timed."""
    checks = dict(cls.VALIDATORS) | {"pattern": _pattern, "uniqueItems": _unique_items}
    return jsonschema.validators.extend(cls, {k: _timed(v) for k, v in checks.items()})


def objects(value: Any) -> Iterator[Mapping]:
    """Every object in a JSON value, level by level (no recursion on client input)."""
    level = [value]
    while level:
        yield from (v for v in level if isinstance(v, Mapping))
        level = [
            x for v in level if isinstance(v, (Mapping, list)) for x in (v.values() if isinstance(v, Mapping) else v)
        ]
