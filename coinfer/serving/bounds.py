"""A config field's range, declared on the field, and the check that names the field when a value is out of
it: both daemons' configs (``cloud.config``, ``edge.config``) declare their numbers this way, so a bad value
fails at load with ``section.field: must be in [lo, hi], got v``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Bound:
    """A numeric setting's range: ``ge`` / ``gt`` below, ``le`` above (None: open on that side)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def holds(self, v: float) -> bool:
        """``v`` is in range (NaN never is)."""
        if isinstance(v, float) and math.isnan(v):
            return False
        return (
            (self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt) and (self.le is None or v <= self.le)
        )

    def error(self, v: float) -> str:
        """Why ``v`` is out of range ("" when it is not)."""
        return "" if self.holds(v) else f"must be in {self}, got {v}"

    def __str__(self) -> str:
        lo = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else "(-inf"
        return f"{lo}, {self.le:g}]" if self.le is not None else f"{lo}, inf)"


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None, **meta: Any):
    """A dataclass field with its range (``Bound``, under ``metadata["bound"]``) and any other metadata. A
    field that may be None (off) is checked only when set."""
    return field(default=default, metadata={"bound": Bound(ge, gt, le), **meta})


def check_bounds(obj: Any, section: str = "") -> None:
    """Raise ValueError naming the first field of dataclass ``obj`` outside its declared ``Bound``."""
    prefix = f"{section}." if section else ""
    for f in dataclasses.fields(obj):
        b, v = f.metadata.get("bound"), getattr(obj, f.name)
        if b is not None and v is not None and (why := b.error(v)):
            raise ValueError(f"{prefix}{f.name}: {why}")
