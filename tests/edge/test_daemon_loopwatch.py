"""The edge daemon's start without a model (fast; the daemon end to end is in test_daemon.py): loading the
model and opening the front ends hold the loop as start-up (no warning, no stack), and the loop watch
reports stalls once both front ends serve."""

from __future__ import annotations

import logging
import time

from coinfer.edge.config import EdgeConfig
from coinfer.edge.daemon import EdgeDaemon
from coinfer.edge.service import EdgeCore


def _load_model() -> None:
    time.sleep(0.3)  # stands for ONNX Runtime's session creation and the warm-up on the loop


async def test_the_start_is_start_up_and_the_watch_is_armed_once_serving(caplog, monkeypatch):
    async def start(self) -> None:
        _load_model()

    monkeypatch.setattr(EdgeCore, "start", start)
    with caplog.at_level(logging.INFO, logger="coinfer.loop"):
        d = await EdgeDaemon(
            EdgeConfig(model="/unused", warm=False, probe_on_start=False, grpc_port=0, http_port=0)
        ).start()
        try:
            assert d.grpc_port > 0 and d.http_port > 0
            assert d.loopwatch.armed and d.loopwatch.startup_stalls >= 1
        finally:
            await d.stop(grace=0.1)
    # the load counted as start-up's (other tests' armed watches on the shared
    # test loop may still warn about it: the assertion is about this daemon's watch)
    assert d.loopwatch.startup_worst_s >= 0.25
    assert any("start-up held the event loop" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
