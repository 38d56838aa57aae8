"""A rule as a request declares it: its kind, params and display name. The engine that compiles and
runs rules is ``coinfer.rules``; task presets and the wire import the declaration alone (so the presets
and the engine do not import each other)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

RULE_KINDS = ("json_schema", "numeric_bounds", "membership", "count", "length", "regex", "arithmetic", "task_check")


@dataclass(frozen=True)
class Rule:
    """One declarative rule as it travels with a request."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or (f"{self.kind}:{self.params['check']}" if self.kind == "task_check" else self.kind)
