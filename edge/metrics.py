"""Prometheus metrics of the edge daemon (served on the HTTP API's /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coinfer.types import BreakerState

_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EdgeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "coinfer_edge_requests", "Requests answered, by plan run and answer source", ["plan", "source"], registry=r
        )
        self.plans = Counter("coinfer_edge_plan_chosen", "Plan chosen per request", ["plan"], registry=r)
        self.drafts = Counter("coinfer_edge_drafts", "Drafts written (rate = drafts/s)", registry=r)
        self.tokens = Counter("coinfer_edge_draft_tokens", "Draft tokens generated (rate = tokens/s)", registry=r)
        self.fallbacks = Counter(
            "coinfer_edge_fallbacks",
            "Answers served locally because the cloud failed or its circuit was open",
            ["reason"],
            registry=r,
        )
        self.ttft = Histogram("coinfer_edge_ttft_seconds", "Time to the first answer byte", buckets=_S, registry=r)
        self.latency = Histogram("coinfer_edge_request_seconds", "Request wall time", buckets=_S, registry=r)
        self.plan_ratio = Histogram(
            "coinfer_edge_plan_latency_ratio",
            "Measured / predicted latency of the plan the planner chose "
            "(its calibration: 1 is exact; a drift says re-probe or a changed link)",
            ["plan"],
            buckets=(0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0),
            registry=r,
        )
        self.errors = Counter("coinfer_edge_bad_requests", "Requests refused, by field", ["field"], registry=r)
        self.active = Gauge("coinfer_edge_active", "Requests in flight", registry=r)
        self.circuit = Gauge("coinfer_edge_cloud_circuit_open", "1 while the circuit to the cloud is open", registry=r)
        self.circuit_changes = Counter(
            "coinfer_edge_cloud_circuit_changes",
            "Moves of the circuit breaker to the cloud, by the state it moved to",
            ["state"],
            registry=r,
        )
        self.replays = Counter(
            "coinfer_edge_session_replays",
            "Cloud sessions replayed on another replica after failing before their summary (killed, draining, full)",
            registry=r,
        )
        self.replica_serving = Gauge(
            "coinfer_edge_cloud_replica_serving",
            "1 while this cloud replica serves (its health as this edge sees it)",
            ["replica"],
            registry=r,
        )
        self.replica_queue = Gauge(
            "coinfer_edge_cloud_replica_queue_depth",
            "Requests waiting at this cloud replica (its last Status)",
            ["replica"],
            registry=r,
        )

    def replicas(self, replicas) -> None:
        """Per-replica gauges from the link's view (``coinfer.edge.link.Replica``)."""
        for r in replicas:
            self.replica_serving.labels(r.address).set(1 if r.serving else 0)
            self.replica_queue.labels(r.address).set(r.queue_depth)

    def circuit_moved(self, state: BreakerState) -> None:
        """The breaker moved (``CircuitBreaker.on_change``): the gauge follows at once, not at the next
        request's end (the health watch moves it between requests)."""
        self.circuit_changes.labels(state.value).inc()
        self.circuit.set(1 if state is BreakerState.OPEN else 0)

    def bad_request(self, field: str) -> None:
        self.errors.labels(field[:40]).inc()
