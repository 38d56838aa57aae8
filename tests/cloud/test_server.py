"""The cloud server's start, around a stand-in engine: the loop watch counts the engine's load as start-up
(no warning, no stack) and reports stalls once an engine is attached and the server serves."""

from __future__ import annotations

import logging
import time

from coinfer.cloud.config import CloudConfig, EngineConfig
from coinfer.cloud.server import create_server
from tests.cloud.test_heartbeat import StandIn
from tests.waiting import until


def _import_vllm() -> None:
    time.sleep(0.3)  # stands for importing torch and vLLM on the loop (2.7 s seen)


def _check_on_the_loop() -> None:
    time.sleep(0.3)  # stands for a CPU-bound check run on the loop by mistake


async def test_the_engine_load_is_start_up_and_serving_stalls_are_warned(caplog):
    with caplog.at_level(logging.INFO, logger="coinfer.loop"):
        srv = await create_server(CloudConfig(engine=EngineConfig(model="/unused"), port=0))
        try:
            assert not srv.loopwatch.armed
            _import_vllm()
            await srv.attach_engine(StandIn())
            assert srv.loopwatch.armed and srv.loopwatch.startup_stalls >= 1
            _check_on_the_loop()
            # the next beat reports it (measured 0.01 s: at once, the beat being overdue)
            await until(lambda: srv.loopwatch.stalls, guard_s=5, what="the serving stall counted", poll_s=0.01)
        finally:
            await srv.stop(grace=0.1)
    # the test session's loop is shared with other tests' servers, whose own (armed) watches may warn
    # about these sleeps too: the assertions are about this server's watch and who was named
    # lower bounds only: a 0.3 s blocking call holds the loop at least 0.29 s past a 10 ms beat, and a busy
    # machine only adds to that (its hiccups may count as stalls too: no count of them is asserted)
    assert srv.loopwatch.startup_worst_s >= 0.25 and srv.loopwatch.worst_s >= 0.25
    watch = id(srv.loopwatch)  # other servers' watches on this loop see the same stalls: theirs are not asserted
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and getattr(r, "watch", 0) == watch
    ]
    # the stack taken while the check held the loop: the watch's thread looks every 10 ms, so it has ~250 ms
    # (25x) to see the loop held past the 50 ms threshold; the engine's load was start-up's, never warned
    assert any("_check_on_the_loop" in w for w in warnings) and not any("_import_vllm" in w for w in warnings)
    assert any("start-up held the event loop" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


async def test_exact_split_on_a_target_that_rounds_near_ties_is_warned_at_start_and_only_then(caplog):
    """A bfloat16 target (``tie_nats`` 0.25: what ``auto`` takes on a CPU with bfloat16 instructions) under the
    default verifier, "exact": the operator is told split answers the cloud plan's text only up to near-ties, and
    how to get word for word. Not for float32, nor for a verifier that never promised the cloud plan's text."""
    import dataclasses

    from coinfer.cloud.config import PolicyConfig
    from coinfer.cloud.vllm_common import TIE_NATS
    from coinfer.types import VerifierKind

    async def said(tie: float, verifier: VerifierKind = VerifierKind.EXACT) -> list[str]:
        caplog.clear()
        cfg = CloudConfig(engine=EngineConfig(model="/unused"), port=0)
        cfg = dataclasses.replace(cfg, policy=PolicyConfig(verifier=verifier))
        srv = await create_server(cfg)
        engine = StandIn()
        engine.tie_nats = tie
        with caplog.at_level(logging.WARNING, logger="coinfer.cloud.server"):
            try:
                await srv.attach_engine(engine)
            finally:
                await srv.stop(grace=0.1)
        return [
            r.getMessage() for r in caplog.records if r.name == "coinfer.cloud.server" and "'exact'" in r.getMessage()
        ]

    warned = await said(TIE_NATS["bfloat16"])
    assert len(warned) == 1 and "bfloat16" in warned[0] and "--engine.dtype float32" in warned[0]
    assert await said(TIE_NATS["float32"]) == []
    assert await said(TIE_NATS["bfloat16"], VerifierKind.LIKELIHOOD) == []
