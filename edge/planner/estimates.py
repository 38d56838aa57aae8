"""The planner's measured quantities: probed, then updated online (EWMA) from every request,
persisted across restarts, re-probed when stale. An absurd measurement (zero or negative
bandwidth, a negative or non-finite time, a quality outside [0, 1]) is refused and noted;
a quantity never measured uses a conservative default, also noted, so ``--explain`` can say
which numbers are guesses."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from coinfer.serving import statefile
from coinfer.validate import MAX_DEADLINE_MS

log = logging.getLogger(__name__)

# conservative: slow disk, slow link, slow cloud — a guess should not lure a request away
DEFAULTS: dict[str, float] = {
    "disk_read_bps": 100e6,
    "pcie_h2d_bps": 4e9,
    "session_ms": 2000.0,
    "warmup_ms": 200.0,
    "first_run_ms": 100.0,
    "prefill_ms_per_token": 1.0,
    "step_ms.1": 30.0,
    "rtt_ms": 100.0,
    "up_bps": 125e3,
    "down_bps": 125e3,
    "queue_ms": 0.0,
    "verify_ms": 100.0,
    "refine_ttft_ms": 200.0,
    "refine_ms_per_token": 20.0,
    "setup_ms": 50.0,
    "draft_tokens": 48.0,
    "answer_tokens": 48.0,
    "rounds": 1.5,
    "decode_steps.split": 64.0,
    "decode_steps.cloud": 128.0,
    "quality.edge": 0.35,
    "quality.split": 0.6,
    "quality.cloud": 0.6,
    # an escalated split (auto's edge answer failed the rules): its first round is known bad, so the
    # cloud retries or answers alone; kept apart from splits chosen up front (``rounds.escalated.<task>``)
    "rounds.escalated": 2.0,
    "decode_steps.escalated": 128.0,
    "quality.escalated": 0.6,
}
# Outcomes — how many tokens, rounds and decode steps a task's request takes, how often its
# answer is valid, how much slower a fresh session's first request drafts — are draws from a distribution whose mean is what the cost model wants: a
# running mean, then an EWMA over ~1/OUTCOME_ALPHA requests, so one hard problem does not
# swing the next plan. Speeds, the network and the cloud's load track conditions: ``alpha``.
OUTCOMES = ("draft_tokens", "answer_tokens", "decode_steps", "rounds", "quality", "first_run", "cloud_tokens")
OUTCOME_ALPHA = 0.05
STALE_AFTER_S = 10.0
"""A speed last measured this long ago is replaced by the next measurement, not averaged with it: it describes
conditions that have passed. The stages only split measures (the edge's decode step, the verification) were
last measured at the end of the split ladder, overloaded, when auto began after the cloud plan's: auto
re-explored split once in 10 s, each run moved the estimate by ``alpha``, and it ran the cloud plan for 274 of
275 arith requests at 0.99x plain vLLM's capacity where split held 5.9x (``benchmarks.capacity``, run W)."""
_BOUNDS = {
    "bps": (1e3, 1e12),
    "ms": (0.0, float(MAX_DEADLINE_MS)),  # no stage of a request outlasts the longest deadline
    "tokens": (1.0, 1e5),
    "quality": (0.0, 1.0),
    "bytes_per_token": (0.25, 64.0),
}


def _bounds(key: str) -> tuple[float, float]:
    if key == "bytes_per_token":
        return _BOUNDS["bytes_per_token"]
    if key.endswith("_bps"):
        return _BOUNDS["bps"]
    if key.startswith("quality."):
        return _BOUNDS["quality"]
    if key.startswith(("decode_steps", "cloud_tokens")):
        # 0 is a measurement: a split whose draft the cloud accepted as is decodes nothing, and when the
        # rules decide, costs the engine nothing (``cloud_tokens``: the cloud's reported work) (refused as
        # absurd before, split kept its 64-step default: 428 ms predicted for word problems whose
        # splits took a median 104 ms)
        return (0.0, _BOUNDS["tokens"][1])
    if ("tokens" in key and not key.endswith("_per_token")) or key.startswith("rounds"):
        return _BOUNDS["tokens"]
    return _BOUNDS["ms"]


def _family(key: str) -> str:
    """Per-task keys (``draft_tokens.arith``) fall back to their family's default."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        k = ".".join(parts[:i])
        if k in DEFAULTS:
            return k
    return key


class EstimatesFile(BaseModel):
    """The calibration file's schema (``coinfer.serving.statefile``): measurements by key, finite."""

    model_config = ConfigDict(allow_inf_nan=False)
    values: dict[str, float]
    updated: dict[str, float] = {}
    counts: dict[str, int] = {}


@dataclass
class Estimates:
    values: dict[str, float] = field(default_factory=dict)
    updated: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: Path | None = None
    alpha: float = 0.3
    _logged: set[str] = field(default_factory=set, repr=False)
    """Caveats already logged: ``choose`` re-derives its defaults per request, the log says each once."""

    def observe(self, key: str, value: float | None, replace: bool = False) -> bool:
        """Fold one measurement in (EWMA; ``replace`` for a fresh probe, and for a speed last measured over
        ``STALE_AFTER_S`` ago; an outcome last measured that long ago weighs as one request against this
        one). False if refused."""
        lo, hi = _bounds(key)
        if value is None or not math.isfinite(value) or not lo <= value <= hi:
            self.note(f"{key}: refused absurd measurement {value!r} (valid {lo:g}..{hi:g})", key=f"{key}: refused")
            return False
        old = self.values.get(key)
        now, outcome = time.time(), key.startswith(OUTCOMES)
        stale = now - self.updated.get(key, now) > STALE_AFTER_S
        if outcome and stale:
            # the mean so far was taken under the load of then (an overloaded split's hedge answers with the
            # cloud's own decode steps): it counts as one request against this one, then the mean runs on
            self.counts[key] = min(self.counts.get(key, 0), 1)
        a = max(1.0 / (self.counts.get(key, 0) + 1), OUTCOME_ALPHA) if outcome else self.alpha
        replace = replace or (not outcome and stale)
        self.values[key] = value if (old is None or replace) else (1 - a) * old + a * value
        self.updated[key] = now
        self.counts[key] = self.counts.get(key, 0) + 1
        return True

    def get(self, key: str) -> float:
        if key in self.values:
            return self.values[key]
        fam = _family(key)
        if fam != key and fam in self.values:
            return self.values[fam]
        self.note(f"{key}: not measured yet, default {DEFAULTS[fam]:g}")
        return DEFAULTS[fam]

    def mean(self, family: str) -> float:
        """Mean of the measured per-task keys of ``family`` (``decode_steps.split.*``), else ``get``."""
        vals = [v for k, v in self.values.items() if k.startswith(family + ".")]
        return sum(vals) / len(vals) if vals else self.get(family)

    def has(self, key: str) -> bool:
        return key in self.values

    def stale(self, key: str, max_age_s: float) -> bool:
        return time.time() - self.updated.get(key, 0.0) > max_age_s

    def note(self, text: str, key: str | None = None) -> None:
        """Add a caveat for ``--explain``; one with ``key`` replaces earlier ones that start with it
        (a repeated failure with a new value is one caveat, not a growing list)."""
        if key is not None:
            self.forget(key, keep=text)
        if text not in self.notes:
            self.notes.append(text)
            if text not in self._logged and len(self._logged) < 10_000:
                self._logged.add(text)
                log.info("planner: %s", text)

    def forget(self, fragment: str, keep: str = "") -> None:
        """Drop the caveats that contain ``fragment`` (except ``keep``)."""
        self.notes[:] = [n for n in self.notes if fragment not in n or n == keep]

    def step_ms(self) -> dict[int, float]:
        out = {int(k.split(".")[1]): v for k, v in self.values.items() if k.startswith("step_ms.")}
        return out or {1: self.get("step_ms.1")}

    # ---- persistence ----------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path | None) -> Estimates:
        est = cls(path=Path(path) if path else None)
        data = statefile.load(est.path, EstimatesFile)  # invalid: set aside (logged), defaults
        if (
            data is None
            and est.path is not None
            and not est.path.exists()
            and any(est.path.parent.glob(f"{est.path.name}.invalid-*"))
        ):
            est.note(f"{est.path}: invalid calibration file set aside; starting from defaults")
        if data is not None:
            for k, v in data.values.items():
                if est.observe(k, v, replace=True):  # each value within its bounds, or refused with a note
                    est.updated[k] = data.updated.get(k, 0.0)
            # a file without counts (older format) still holds means: weigh each as one sample
            est.counts = {k: data.counts.get(k, 1) for k in est.values}
        return est

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"values": self.values, "updated": self.updated, "counts": self.counts}, indent=1))
        os.replace(tmp, self.path)
