"""The planner's measured quantities: probed, then updated from every request, persisted across restarts.

Each quantity is one decayed estimate (``coinfer.estimator.Decayed``, ``TAU_S``): speeds, the network,
the cloud's times, a task's outcomes (tokens, rounds, decode steps, rule-valid answers) and a plan's own
latency per task, which carries the spread the planner's exploration draws on. An estimate not fed
fades and grows uncertain; nothing is reset or replaced for its age. A probe's reading (disk, PCIe,
decode steps, the network, the cloud's queue) restarts its estimate: it measures this moment on purpose.
An absurd measurement (zero or negative bandwidth, a negative or non-finite time, a quality outside
[0, 1]) is refused and noted; a quantity never measured uses a conservative default, also noted, so
``--explain`` can say which numbers are guesses."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coinfer.estimator import Decayed, DecayedTable, with_age
from coinfer.serving import statefile
from coinfer.validate import MAX_DEADLINE_MS

log = logging.getLogger(__name__)

TAU_S = 10.0
"""Seconds in which a measurement's weight falls to 1/e (``coinfer.estimator``): the planner's memory.
Its trade-off and status are in docs/planner.md (constants): shorter re-explores a plan measured under
a burst sooner, longer explores less on a quiet edge. ``EdgeConfig.planner_tau_s`` sets it."""
SAVE_EVERY_S = 1.0
"""The estimates file is written at most this often while the daemon serves (every answer changes it): a
crash loses at most this much learning; a shutdown flushes the latest."""

FORMAT_VERSION = 2
"""The state file's format: decayed estimates (1, unversioned: EWMA means without spreads, ignored)."""

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


class EstimateState(BaseModel):
    """One estimate in the state file: ``Decayed`` as of its newest sample, ``age_s`` before the save."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")
    mean: float
    weight: float = Field(ge=0)
    sq_weight: float = Field(ge=0)
    m2: float = Field(ge=0)
    age_s: float = Field(ge=0)


class EstimatesFile(BaseModel):
    """The calibration file's schema (``coinfer.serving.statefile``). ``values`` is the format before
    version 2 (EWMA means without spreads): still read, so that such a file is ignored with a note rather
    than set aside as invalid."""

    model_config = ConfigDict(allow_inf_nan=False)
    version: int = 1
    saved_at: float = 0.0
    """Wall-clock seconds of the save: the downtime until the next start ages the estimates."""
    estimates: dict[str, EstimateState] | None = None
    values: dict[str, float] | None = None


class Estimates:
    """Decayed estimates by key (``draft_tokens.arith``, ``verify_ms``, ``latency_ms.split.arith``), on a
    monotonic ``clock``; ``path``: where they persist (written off the event loop)."""

    def __init__(
        self,
        *,
        path: Path | None = None,
        tau_s: float = TAU_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``wall``: the wall clock, read only to age a saved file by the downtime (a monotonic clock does
        not survive a restart)."""
        self.table: DecayedTable[str] = DecayedTable(tau_s=tau_s, clock=clock)
        self.path = path
        self.wall = wall
        self.notes: list[str] = []
        self._logged: set[str] = set()
        """Caveats already logged: ``choose`` re-derives its defaults per request, the log says each once."""
        self._writer = statefile.OffLoopWriter(path, SAVE_EVERY_S) if path is not None else None

    @property
    def tau_s(self) -> float:
        return self.table.tau_s

    def observe(self, key: str, value: float | None, *, replace: bool = False) -> bool:
        """Fold one measurement in; ``replace``: a probe's reading, which restarts the estimate. False (and a
        note) if refused as absurd."""
        lo, hi = _bounds(key)
        if value is None or not math.isfinite(value) or not lo <= value <= hi:
            self.note(f"{key}: refused absurd measurement {value!r} (valid {lo:g}..{hi:g})", key=f"{key}: refused")
            return False
        if replace:
            self.table.restart(key, float(value))
        else:
            self.table.add(key, float(value))
        return True

    def estimate(self, key: str) -> Decayed | None:
        """``key``'s estimate as it stands now, spread and weight included (None: never measured)."""
        return self.table.get(key)

    def get(self, key: str) -> float:
        """``key``'s mean; a per-task key never measured falls back to its family's measurement, else to the
        family's default (noted)."""
        if (d := self.table.get(key)) is not None:
            return d.mean
        fam = _family(key)
        if fam != key and (d := self.table.get(fam)) is not None:
            return d.mean
        self.note(f"{key}: not measured yet, default {DEFAULTS[fam]:g}")
        return DEFAULTS[fam]

    def measured(self, key: str) -> float | None:
        """``key``'s mean, None until measured (no default: for what must not be guessed)."""
        d = self.table.get(key)
        return None if d is None else d.mean

    def means(self) -> dict[str, float]:
        """Every measured key's mean."""
        return {k: d.mean for k, d in self.table.stored().items()}

    def mean(self, family: str) -> float:
        """Mean of the measured per-task keys of ``family`` (``decode_steps.split.*``), else ``get``."""
        vals = [v for k, v in self.means().items() if k.startswith(family + ".")]
        return sum(vals) / len(vals) if vals else self.get(family)

    def has(self, key: str) -> bool:
        return key in self.table

    def age_s(self, key: str) -> float:
        """Seconds since ``key`` was last measured (inf: never)."""
        return self.table.age_s(key)

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
        out = {int(k.split(".")[1]): v for k, v in self.means().items() if k.startswith("step_ms.")}
        return out or {1: self.get("step_ms.1")}

    # ---- persistence ----------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | Path | None,
        *,
        tau_s: float = TAU_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> Estimates:
        """The estimates saved at ``path`` (aged by the downtime since), else empty. An invalid file is set
        aside (``statefile.load``); one of the format before the decayed estimates is ignored, with a note."""
        est = cls(path=Path(path) if path else None, tau_s=tau_s, clock=clock, wall=wall)
        data = statefile.load(est.path, EstimatesFile)  # invalid: set aside (logged), defaults
        if data is None:
            if (
                est.path is not None
                and not est.path.exists()
                and any(est.path.parent.glob(f"{est.path.name}.invalid-*"))
            ):
                est.note(f"{est.path}: invalid calibration file set aside; starting from defaults")
            return est
        if data.estimates is None or data.version < FORMAT_VERSION:
            est.note(
                f"{est.path}: calibration file of an older format (means without spreads) ignored; starting "
                "from defaults (it is rewritten at the next save)"
            )
            return est
        est._load(data)
        return est

    def _load(self, data: EstimatesFile) -> None:
        now, downtime = self.table.clock(), max(0.0, self.wall() - data.saved_at)
        for key, s in (data.estimates or {}).items():
            lo, hi = _bounds(key)
            if not lo <= s.mean <= hi:
                self.note(f"{key}: refused absurd saved value {s.mean!r} (valid {lo:g}..{hi:g})", key=f"{key}: refused")
                continue
            state = Decayed(mean=s.mean, weight=s.weight, sq_weight=s.sq_weight, m2=s.m2)
            self.table.load(key, with_age(state, s.age_s + downtime, now))

    def snapshot(self) -> str:
        """The state file's text: every estimate as of its newest sample, with its age now."""
        now = self.table.clock()
        states = {
            k: {"mean": d.mean, "weight": d.weight, "sq_weight": d.sq_weight, "m2": d.m2, "age_s": max(0.0, now - d.at)}
            for k, d in self.table.stored().items()
        }
        return json.dumps({"version": FORMAT_VERSION, "saved_at": self.wall(), "estimates": states}, indent=1)

    def save(self) -> None:
        """Persist (no path: nothing). From the event loop the write runs in a worker thread, at most every
        ``SAVE_EVERY_S`` (``flush`` writes the latest at once); outside one, at once."""
        if self._writer is not None:
            self._writer.write(self.snapshot)

    async def flush(self) -> None:
        """Wait for the writes ``save`` started."""
        if self._writer is not None:
            await self._writer.flush()
