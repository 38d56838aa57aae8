"""Prometheus metrics of the cloud service, fed from the domain events every session emits.

One registry per service (tests start several in one process). Exposed over
HTTP by ``prometheus_client``'s own server on ``metrics_port`` (a thread: the
gRPC event loop never serves a scrape).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from coinfer import types as t

_MS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class CloudMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.sessions = Counter("coinfer_sessions", "Sessions finished, by outcome", ["outcome"], registry=r)
        self.active = Gauge("coinfer_sessions_active", "Sessions in flight", registry=r)
        self.drafts = Counter("coinfer_drafts_verified", "Drafts verified (rules, then the LLM verifier)", registry=r)
        self.duplicates = Counter("coinfer_drafts_duplicate", "Drafts merged into an equal earlier draft", registry=r)
        self.rule_failures = Counter(
            "coinfer_rule_failures", "Drafts that failed a rule, by rule", ["rule"], registry=r
        )
        self.verify = Histogram("coinfer_verify_seconds", "Time to verify one draft", buckets=_MS, registry=r)
        self.ttft = Histogram("coinfer_refine_ttft_seconds", "Refinement time to first token", buckets=_MS, registry=r)
        self.refine_tps = Histogram(
            "coinfer_refine_tokens_per_second",
            "Refinement decode speed (chunks/s)",
            buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000),
            registry=r,
        )
        self.session_seconds = Histogram("coinfer_session_seconds", "Session wall time", buckets=_MS, registry=r)
        self.retries = Counter("coinfer_retries", "Retry advice sent to the edge", registry=r)
        self.recommended = Gauge("coinfer_recommended_drafts", "Recommended draft count", registry=r)
        self.load = Gauge("coinfer_load", "Smoothed engine load in [0, 1] the draft count follows", registry=r)
        self.weights = Gauge("coinfer_scheduler_weight", "Scheduler score weights a, b, g", ["name"], registry=r)
        self.engine = Gauge("coinfer_engine_requests", "vLLM scheduler requests", ["state"], registry=r)
        self.restarts = Counter(
            "coinfer_engine_restarts", "Engine restarts after a failed heartbeat, by reason", ["reason"], registry=r
        )
        self.kv_usage = Gauge("coinfer_engine_kv_cache_usage", "vLLM KV-cache use in [0, 1]", registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the scrape endpoint; returns the bound port (``port`` 0 picks a free one)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return server.server_port

    def close(self) -> None:
        if getattr(self, "_http", None) is not None:
            self._http.shutdown()
            self._http = None

    def observe(self, ev: object, chunks: list[int]) -> None:
        """Count one session event. ``chunks`` carries the session's answer-chunk count."""
        if isinstance(ev, t.Verdict):
            if ev.duplicate_of:
                self.duplicates.inc()
                return
            self.drafts.inc()
            self.verify.observe(ev.verify_ms / 1e3)
            if ev.failed_rule:
                self.rule_failures.labels(ev.failed_rule).inc()
        elif isinstance(ev, t.AnswerChunk):
            chunks[0] += 1
        elif isinstance(ev, t.RetryAdvice):
            self.retries.inc()
        elif isinstance(ev, t.Summary):
            tm = ev.timings
            if tm.refine_ttft_ms > 0:
                self.ttft.observe(tm.refine_ttft_ms / 1e3)
            decode_s = (tm.refine_ms - tm.refine_ttft_ms) / 1e3
            if decode_s > 0 and chunks[0] > 1:
                self.refine_tps.observe((chunks[0] - 1) / decode_s)
            self.session_seconds.observe(tm.total_ms / 1e3)
