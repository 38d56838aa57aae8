"""The edge's own closed sets, one definition each (the shared ones -- ``Plan``, ``RefineMode``,
``FinishReason``, ``ResultSource`` -- are ``coinfer.types``'). ``StrEnum``: every member equals its wire string
(the gRPC ``SolveResult`` and the HTTP ``coinfer`` block carry strings), so conversion happens once,
at the boundary, and a comparison with the string still holds."""

from __future__ import annotations

from enum import StrEnum

from coinfer.errors import Reason
from coinfer.types import Plan


class RequestedPlan(StrEnum):
    """What a request (``SolveRequest.plan``) or the daemon (``EdgeConfig.plan``) may ask for: a plan,
    or ``auto`` (the planner picks one). A ``Plan`` is what runs; this is what was asked."""

    AUTO = "auto"
    EDGE = Plan.EDGE.value
    SPLIT = Plan.SPLIT.value
    CLOUD = Plan.CLOUD.value

    @property
    def plan(self) -> Plan | None:
        """The plan asked for; None for ``auto``."""
        return None if self is RequestedPlan.AUTO else Plan(self.value)


class FallbackKind(StrEnum):
    """Why an answer came from the edge although its plan wanted the cloud, as data (the breaker and
    the metrics decide on it; ``EdgeResult.fallback_reason`` is the sentence for people and
    ``EdgeResult.fallback_status`` the gRPC status the call ended with, if one did)."""

    NO_CLOUD = "NO_CLOUD"
    """Skipped: no cloud is configured."""
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    """Skipped: the circuit breaker is open."""
    SESSIONS_FULL = Reason.SESSIONS_FULL.value
    """The cloud is full (load, not a fault: never counted against it)."""
    DEADLINE = Reason.DEADLINE.value
    """The request's own deadline ran out, the cloud's or the edge's wait (not counted against it)."""
    ENGINE_HUNG = Reason.ENGINE_HUNG.value
    UNAVAILABLE = Reason.UNAVAILABLE.value
    """Loading, draining or dead, by the cloud's ErrorInfo; or the stream ended without a summary."""
    INTERNAL = Reason.INTERNAL.value
    """The cloud's own fault (its ErrorInfo says so)."""
    TRANSPORT = "TRANSPORT"
    """The call failed with no coinfer reason (a broken connection, a proxy, another server): the
    status name is in ``fallback_status``."""

    @property
    def counts_against_cloud(self) -> bool:
        """Whether the circuit breaker counts it. Not a skip, not a full cloud (load) and not a request's
        own deadline (a client asking for 50 ms would otherwise switch the cloud off for everyone; a hung
        engine is caught by the cloud's heartbeat and shows as NOT_SERVING)."""
        return self not in (
            FallbackKind.NO_CLOUD,
            FallbackKind.CIRCUIT_OPEN,
            FallbackKind.SESSIONS_FULL,
            FallbackKind.DEADLINE,
        )

    @classmethod
    def of_reason(cls, reason: str) -> FallbackKind:
        """The kind for a coinfer ``Reason`` a cloud sent (a reason this edge does not know: INTERNAL)."""
        try:
            return cls(reason)
        except ValueError:
            return cls.INTERNAL
