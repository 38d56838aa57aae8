"""The fault campaign's CI form: real cloud and edge processes, faults injected. The full
size, with the hostile-input campaign, is ``python -m benchmarks.faults`` (report in docs/faults/).
Timings (Status p99, seconds back on split) are printed, not asserted: this machine is shared."""

import json

import pytest

pytestmark = pytest.mark.slow


async def test_fault_campaign(tmp_path):
    from scenarios.faults import Campaign, Sizes

    report = await Campaign(Sizes.short(), tmp_path).run()
    print(json.dumps(report, indent=1, default=str))

    slow = report["slow_clients"]
    assert slow["silent_stream_codes"] == {"DEADLINE_EXCEEDED": slow["silent_streams"]}  # never opened: timed out
    assert slow["cloud_active_after"] == 0
    assert slow["closed_by_edge"] == slow["idle_or_slow_http_connections"]  # idle and trickling heads closed
    assert slow["cloud_status"]["errors"] == 0 and slow["edge_healthz"]["errors"] == 0

    ab = report["abandoned"]
    assert ab["active_after"] == 0 and set(ab["first_reply"]) <= {"accepted", "RESOURCE_EXHAUSTED"}
    assert ab["first_reply"].get("RESOURCE_EXHAUSTED", 0) > 0  # the per-edge quota held

    assert report["oversized"] == {
        "Probe 20 MB payload": "RESOURCE_EXHAUSTED",
        "Probe 1 GB answer": "INVALID_ARGUMENT",
        "Generate 1 MB prompt": "RESOURCE_EXHAUSTED",
        "HTTP 2 MB body": 413,
    }

    art = report["artefacts"]
    for kind in ("tampered", "truncated"):
        lazy = art[f"{kind}: lazy edge request"]
        assert lazy["status"] == 503 and "/" not in lazy["body"] and lazy["healthz"] == 200
        assert art[f"{kind}: bad planner state set aside"]
        warm = art[f"{kind}: warm edge start"]
        assert warm["exit"] == 1 and "model.onnx" in warm["names"] and "Traceback" not in warm["names"]

    ek = report["edge_kill"]
    assert ek["sessions_open_at_kill"] > 0 and ek["cloud_active_after"] == 0 and ek["cloud_health_after"] == "SERVING"

    hang = report["engine_hang"]
    assert hang["lost"] == 0 and hang["unflagged_edge_only"] == 0 and not hang["hung_engine_process_left"]
    assert hang["serving_again_after_s"] > hang["not_serving_after_s"] > 0

    kill = report["cloud_kill"]
    assert kill["lost"] == 0 and kill["unflagged_edge_only"] == 0, kill
    assert kill["processes_before_kill"] >= 1 and kill["processes_left_15s_after_kill"] == 0, kill["left"]
    assert max(kill["edges_back_on_split_after_serving_s"]) < 60  # every edge went back to the cloud
    assert kill["first_cloud_answer_started_after_serving_s"] is not None

    drain = report["drain"]
    assert drain["lost"] == 0 and drain["exit_code"] == 0
    # the engine's processes end by themselves after the drain, within the campaign's hang guard (DRAIN_GUARD_S)
    assert drain["processes_left_after_exit"] == 0 and drain["all_gone_after_exit_s"] is not None, drain["left"]
    assert drain["engine_dead_errors_logged"] == 0, drain
