"""Estimates: absurd measurements refused and said, defaults said, EWMA, persistence, staleness."""

import dataclasses
import json
import math

import pytest

from coinfer.edge.planner.estimates import DEFAULTS, STALE_AFTER_S, Estimates
from coinfer.edge.planner.planner import EXPLORE_RUNS, REEXPLORE_AFTER_S, REEXPLORE_EVERY, EdgeState, Planner


def test_absurd_measurements_are_refused_and_noted():
    e = Estimates()
    for key, bad in [
        ("up_bps", 0.0),
        ("rtt_ms", -3.0),
        ("disk_read_bps", math.inf),
        ("quality.edge.arith", 1.5),
        ("verify_ms", math.nan),
        ("down_bps", None),
    ]:
        assert e.observe(key, bad) is False
        assert key not in e.values
    assert len(e.notes) == 6 and "refused absurd" in e.notes[0]
    assert e.get("up_bps") == DEFAULTS["up_bps"] and any("not measured yet" in n for n in e.notes)


def test_ewma_family_defaults_and_persistence(tmp_path):
    path = tmp_path / "cal" / "planner.json"
    e = Estimates.open(path)
    e.observe("rtt_ms", 10.0)
    e.observe("rtt_ms", 20.0)
    assert e.get("rtt_ms") == 13.0  # 0.7 * 10 + 0.3 * 20
    e.observe("rtt_ms", 50.0, replace=True)
    assert e.get("rtt_ms") == 50.0
    # a speed last measured over STALE_AFTER_S ago describes conditions that have passed: replaced, not averaged
    e.observe("verify_ms", 400.0)  # measured while the cloud was overloaded
    e.updated["verify_ms"] -= STALE_AFTER_S + 1
    e.observe("verify_ms", 20.0)
    assert e.get("verify_ms") == 20.0
    e.observe("verify_ms", 30.0)
    assert e.get("verify_ms") == 23.0  # fresh: averaged again
    e.observe("rounds.arith", 3.0)
    e.updated["rounds.arith"] -= STALE_AFTER_S + 1
    e.observe("rounds.arith", 1.0)
    assert e.get("rounds.arith") == 2.0  # an outcome is a mean over requests, however old: never replaced
    # ... but a mean over many requests taken long ago (under the load of then) weighs as one against the next
    for _ in range(100):
        e.observe("decode_steps.split.select", 200.0)  # an overloaded split's hedge: the cloud's own decode
    e.observe("decode_steps.split.select", 10.0)
    assert e.get("decode_steps.split.select") == pytest.approx(190.5)  # fresh: an EWMA over ~20 requests
    e.updated["decode_steps.split.select"] -= STALE_AFTER_S + 1
    e.observe("decode_steps.split.select", 10.0)
    assert e.get("decode_steps.split.select") == pytest.approx(100.25)  # stale: one request against one
    e.observe("decode_steps.split.select", 10.0)  # then the running mean goes on: 1/3
    assert e.get("decode_steps.split.select") == pytest.approx(100.25 * 2 / 3 + 10.0 / 3)
    e.observe("draft_tokens", 30.0)
    assert e.get("draft_tokens.select") == 30.0  # a task never seen uses its family's measurement
    for v in (10.0, 50.0):  # an outcome: a running mean, not the last few requests
        e.observe("draft_tokens", v)
    assert e.get("draft_tokens") == 30.0
    for _ in range(200):
        e.observe("draft_tokens", 60.0)
    assert 59.0 < e.get("draft_tokens") < 60.0  # then an EWMA: it still follows a lasting change
    e.save()
    again = Estimates.open(path)
    assert again.get("rtt_ms") == 50.0 and not again.stale("rtt_ms", 60) and again.stale("up_bps", 60)
    path.write_text(json.dumps({"values": {"rtt_ms": -1, "up_bps": 1e6}}))
    third = Estimates.open(path)
    assert "rtt_ms" not in third.values and third.get("up_bps") == 1e6


def test_planner_falls_back_to_defaults_and_says_so():
    p = Planner(Estimates())
    c = p.choose("arith", 40, 40, 5, EdgeState(2_000_000, "warm"), cloud_available=True)
    assert c.plan in ("edge", "split", "cloud") and set(c.breakdowns) == {"edge", "split", "cloud"}
    assert any("not measured yet" in n for n in c.notes)
    assert p.choose("arith", 40, 40, 5, EdgeState(2_000_000, "cold"), cloud_available=False).plan == "edge"


def test_auto_runs_each_cloud_plan_a_few_times_for_the_task_then_chooses_by_measurement():
    p = Planner(Estimates())
    warm = EdgeState(2_000_000, "warm")
    p.est.observe("quality.edge.arith", 1.0)
    first = p.choose("arith", 40, 40, 5, warm, cloud_available=True)
    assert first.plan == "split" and first.reason.startswith(f"explore: split was run 0 of {EXPLORE_RUNS} times")
    for i in range(EXPLORE_RUNS):  # the cloud accepted a draft as is, then refined: measurements both
        assert p.choose("arith", 40, 40, 5, warm, cloud_available=True).plan == "split"
        p.est.observe("decode_steps.split.arith", 0.0 if i % 2 else 40.0)
    assert 0.0 < p.est.get("decode_steps.split.arith") < 40.0  # a mean, not the first run
    for _ in range(EXPLORE_RUNS):
        assert p.choose("arith", 40, 40, 5, warm, cloud_available=True).plan == "cloud"
        p.est.observe("decode_steps.cloud.arith", 30.0)
    after = p.choose("arith", 40, 40, 5, warm, cloud_available=True)
    assert (
        not after.reason.startswith("explore")
        and after.plan == min(after.breakdowns.values(), key=lambda b: b.total_ms).plan
    )
    # a plan under the quality floor is not explored; without a cloud nothing is
    floor = Planner(Estimates(), quality_floor=0.9)
    assert not floor.choose("arith", 40, 40, 5, warm, cloud_available=True).reason.startswith("explore")
    assert Planner(Estimates()).choose("arith", 40, 40, 5, warm, cloud_available=False).plan == "edge"


def test_a_cloud_plan_auto_has_not_run_for_a_while_runs_once_and_its_estimate_follows():
    now = [0.0]
    p = Planner(Estimates(), clock=lambda: now[0])
    warm = EdgeState(2_000_000, "warm")
    for plan in ("split", "cloud"):  # explored; split was measured in a burst: far slower than the cloud
        for _ in range(EXPLORE_RUNS):
            p.est.observe(f"decode_steps.{plan}.select", 10.0)
    p.est.observe("verify_ms", 5_000.0)

    def run(choices: int, seconds_each: float) -> list[str]:
        out = []
        for _ in range(choices):
            now[0] += seconds_each
            out.append(p.choose("select", 40, 40, 5, warm, cloud_available=True))
        return out

    # split has not run since the clock began: after REEXPLORE_EVERY choices it runs once, then waits again
    plans = run(2 * REEXPLORE_EVERY, REEXPLORE_AFTER_S)
    stale = [i for i, c in enumerate(plans) if c.plan == "split"]
    assert stale == [REEXPLORE_EVERY - 1, 2 * REEXPLORE_EVERY - 1]  # once every REEXPLORE_EVERY choices
    assert plans[stale[0]].reason.startswith(f"re-explore: split has not run for {REEXPLORE_EVERY} choices")
    # at a high request rate the count comes sooner than the time: it waits for REEXPLORE_AFTER_S too
    fast = run(4 * REEXPLORE_EVERY, REEXPLORE_AFTER_S / (2 * REEXPLORE_EVERY))
    assert [i for i, c in enumerate(fast) if c.plan == "split"] == [2 * REEXPLORE_EVERY - 1, 4 * REEXPLORE_EVERY - 1]
    # a plan run when asked for (not auto's choice) is as fresh as one auto chose
    p.observe("split", "select", 40, 40, 5, _result(1, 20.0, 60.0), warm)
    assert all(c.plan == "cloud" for c in run(REEXPLORE_EVERY - 1, REEXPLORE_AFTER_S))


def test_a_cloud_plan_never_run_is_predicted_from_the_answers_the_task_gets():
    # auto never ran the cloud plan for this task: its length is the task's answers', not the
    # conservative 128-step default that kept auto off it forever (786 ms predicted, 150 measured)
    e = Estimates()
    p = Planner(e)
    assert p.shape("words", 40, 40, 5).cloud_steps == DEFAULTS["decode_steps.cloud"]
    e.observe("answer_tokens.words", 36.0)
    assert p.shape("words", 40, 40, 5).cloud_steps == 36.0
    e.observe("decode_steps.cloud.words", 41.0)  # measured: the measurement wins
    assert p.shape("words", 40, 40, 5).cloud_steps == 41.0


def _result(rounds: int, drafting: float, total: float, summary=None):
    from coinfer import types as t
    from coinfer.edge.result import EdgeResult

    drafts = [t.Draft(i, "3+5=8; answer 8", 10, -0.1, drafting) for i in range(5)]
    return EdgeResult(
        "3+5=8; answer 8",
        "refined",
        True,
        drafts=drafts,
        summary=summary,
        rounds=rounds,
        timings={"drafting": drafting, "total": total},
    )


def test_online_updates_from_measured_stage_times():
    from coinfer import types as t

    p = Planner(Estimates())
    p.est.observe("prefill_ms_per_token", 0.0)
    warm, cold = EdgeState(1_000_000, "warm"), EdgeState(1_000_000, "cold")
    p.observe("edge", "arith", 10, 40, 5, _result(1, 50.0, 50.0), warm)
    assert p.est.get("step_ms.5") == 5.0  # 50 ms over the longest draft's 10 tokens
    p.observe("edge", "arith", 10, 40, 5, _result(3, 900.0, 900.0), warm)
    assert p.est.get("step_ms.5") == 5.0  # retry rounds draft at other batch sizes: not a step sample
    p.observe("edge", "arith", 10, 40, 5, _result(1, 80.0, 80.0), cold)
    assert p.est.get("first_run_ms") == 30.0 and p.est.get("step_ms.5") == 5.0  # a fresh session's extra
    summary = t.Summary(
        "3+5=8; answer 8",
        t.AnswerSource.CLOUD,
        [],
        [],
        t.Timings(0.0, 20.0, 220.0, 230.0, decode_steps=40),
        "",
        True,
        5,
        "",
    )
    p.observe("cloud", "arith", 10, 40, 5, dataclasses.replace(_result(0, 0.0, 300.0, summary), drafts=[]), warm)
    assert p.est.get("decode_steps.cloud.arith") == 40.0 and p.est.get("refine_ms_per_token") == 5.0
    assert p.est.get("refine_ttft_ms") == 20.0 and p.est.has("setup_ms")
    assert p.est.get("quality.cloud.arith") == 1.0
    # a split measures the edge-only answer too: any first-round draft valid (round 2's don't count)
    verdicts = {0: t.Verdict(0, False), 1: t.Verdict(1, False), 5: t.Verdict(5, True)}
    split = dataclasses.replace(_result(2, 100.0, 400.0, summary), verdicts=verdicts)
    p.observe("split", "arith", 10, 40, 5, split, warm)
    # the three edge-plan requests above were valid; this one would not have been: mean of 1, 1, 1, 0
    assert p.est.get("quality.split.arith") == 1.0 and p.est.get("quality.edge.arith") == 0.75


def test_the_clouds_reported_cost_is_learnt_per_plan_and_task_and_a_silent_cloud_teaches_none():
    """``Summary.cost`` (engine tokens the cloud computed for the answer) becomes ``cloud_tokens.<plan>.
    <task>``, a mean over answers (0 is an answer: a draft the rules accept costs the engine nothing);
    the request shape carries it; a cloud that reports no cost leaves the plan unmeasured, not 0."""
    from coinfer import types as t

    p = Planner(Estimates())
    warm = EdgeState(1_000_000, "warm")
    assert p.shape("arith", 10, 40, 5).split_work is None and p.shape("arith", 10, 40, 5).cloud_work is None

    def ran(plan: str, cost: t.CloudCost | None) -> None:
        summary = t.Summary("3+5=8; answer 8", t.AnswerSource.CLOUD, timings=t.Timings(total_ms=100.0), cost=cost)
        p.observe(plan, "arith", 10, 40, 5, _result(1, 50.0, 200.0, summary), warm)

    ran("cloud", None)
    assert p.shape("arith", 10, 40, 5).cloud_work is None
    ran("split", t.CloudCost(engine_requests=0))  # accepted by the rules
    ran("split", t.CloudCost(engine_requests=3, prompt_tokens=300, cached_tokens=100, decoded_tokens=40))
    ran("cloud", t.CloudCost(engine_requests=1, prompt_tokens=60, decoded_tokens=40))
    shape = p.shape("arith", 10, 40, 5)
    assert shape.split_work == 120.0 and shape.cloud_work == 100.0  # (0 + 240) / 2; 60 + 40
    assert p.shape("words", 10, 40, 5).split_work is None  # per task


def test_an_escalated_request_teaches_the_edge_and_the_split_apart():
    """Auto's edge answer failed the rules and a split refined its drafts: the edge attempt is learnt
    from the edge's own verdict (its failure rate is the chance of escalating), the split as a split of
    its own (the cloud's speeds as any split; its outcomes apart from splits chosen up front)."""
    from coinfer import types as t

    p = Planner(Estimates())
    p.est.observe("prefill_ms_per_token", 0.0)
    warm = EdgeState(1_000_000, "warm")
    for _ in range(3):  # the edge's answers have passed the rules so far: it never escalates
        p.observe("edge", "arith", 10, 40, 5, _result(1, 50.0, 50.0), warm)
    assert p.choose("arith", 10, 40, 5, warm, cloud_available=True).breakdowns["edge"].escalation_p == 0.0
    edge = dataclasses.replace(_result(1, 50.0, 50.0), valid=False, source="edge_only")
    p.observe("edge", "arith", 10, 40, 5, edge, warm)
    summary = t.Summary(
        answer="3+5=8; answer 8",
        source=t.AnswerSource.REFINED,
        answer_valid=True,
        timings=t.Timings(
            verify_ms=30.0, refine_ttft_ms=20.0, refine_ms=220.0, total_ms=600.0, decode_steps=40, decode_tokens=40
        ),
    )
    # the cloud rejected the same five drafts, advised a retry round, then refined
    split = dataclasses.replace(_result(2, 60.0, 700.0, summary), verdicts={i: t.Verdict(i, False) for i in range(5)})
    p.observe("split", "arith", 10, 40, 5, split, warm, escalated=True)
    est = p.est
    # the edge plan: 3 valid answers and 1 invalid; the split's first-round verdicts are not counted again
    assert est.get("quality.edge.arith") == 0.75 and est.counts["quality.edge.arith"] == 4
    assert est.counts["draft_tokens.arith"] == 4  # the drafts were measured once, with the edge attempt
    # the escalation: its own outcomes
    assert est.get("quality.escalated.arith") == 1.0 and est.get("rounds.escalated.arith") == 2.0
    assert est.get("decode_steps.escalated.arith") == 40.0
    assert not any(est.has(k) for k in ("quality.split.arith", "rounds.arith", "decode_steps.split.arith"))
    # the cloud's speeds: learnt from any split
    assert est.get("refine_ms_per_token") == 5.0 and est.get("refine_ttft_ms") == 20.0 and est.has("verify_ms")
    after = p.choose("arith", 10, 40, 5, warm, cloud_available=True).breakdowns["edge"]
    assert after.escalation_p == 0.25 and after.escalation_cost_ms > 0
    assert after.total_ms == after.attempt_ms + 0.25 * after.escalation_cost_ms
    assert after.quality == 0.75 + 0.25 * 1.0
    # without a cloud there is nothing to escalate to
    assert p.choose("arith", 10, 40, 5, warm, cloud_available=False).breakdowns["edge"].escalation_p == 0.0


async def test_failed_probes_fall_back_and_say_so(tmp_path):
    import grpc

    from coinfer.edge.planner import probes

    class DownStub:  # the cloud unreachable: every RPC fails as grpc.aio would
        async def Probe(self, *a, **k):  # noqa: N802 - gRPC method names
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")

        Status = Probe  # noqa: N815

    class BrokenLM:
        def step(self, *a):
            raise RuntimeError("session lost")

        def empty_past(self):
            return []

    e = Estimates()
    done = await probes.calibrate(e, tmp_path / "missing.onnx", BrokenLM(), DownStub())
    assert done == []
    for what in ("disk", "decode", "network", "status"):
        assert any(n.startswith(f"{what} probe failed") and "using defaults" in n for n in e.notes), e.notes
    assert e.get("rtt_ms") == DEFAULTS["rtt_ms"]  # conservative default, and the planner still chooses
    assert Planner(e).choose("arith", 40, 40, 5, EdgeState(1_000_000, "warm"), cloud_available=True).breakdowns
    e.observe("rtt_ms", 12.0)
    await probes.calibrate(e, stub=DownStub())
    assert any("network probe failed" in n and "keeping the last measurement" in n for n in e.notes)


def test_caveats_do_not_grow_and_old_files_keep_their_means(tmp_path):
    e = Estimates()
    for v in (-1.0, -2.0, -3.0):
        e.observe("rtt_ms", v)
    assert sum("rtt_ms: refused" in n for n in e.notes) == 1 and "-3.0" in e.notes[-1]
    assert e.observe("bytes_per_token", 0.0) is False  # prompt_size divides by it
    path = tmp_path / "old.json"  # written before counts were saved
    path.write_text(json.dumps({"values": {"decode_steps.cloud.arith": 40.0}}))
    old = Estimates.open(path)
    old.observe("decode_steps.cloud.arith", 200.0)
    assert old.get("decode_steps.cloud.arith") == 120.0  # averaged with the saved mean, not replaced by it


def test_first_run_is_the_first_request_on_a_session_not_the_state():
    p = Planner(Estimates())
    p.est.observe("prefill_ms_per_token", 0.0)
    p.est.observe("step_ms.5", 5.0)
    fresh = EdgeState(1_000_000, "warm", fresh=True)  # loaded in the background by a cloud request
    assert p.edge_profile(fresh).first_run_ms == p.est.get("first_run_ms") > 0
    assert p.edge_profile(EdgeState(1_000_000, "warm")).first_run_ms == 0
    p.observe("edge", "arith", 10, 40, 5, _result(1, 90.0, 90.0), fresh)
    assert p.est.get("first_run_ms") == 40.0 and p.est.get("step_ms.5") == 5.0


@pytest.mark.parametrize(
    "body", ['{"values": []}', '{"values": {"rtt_ms": "x"}}', '{"values": {"rtt_ms": NaN}}', "[1, 2]", "not json", ""]
)
def test_a_calibration_file_of_the_wrong_shape_is_set_aside(tmp_path, body):
    from coinfer.edge.planner.estimates import Estimates

    path = tmp_path / "est.json"
    path.write_text(body)
    est = Estimates.open(path)  # never raises: the edge starts from defaults
    assert not est.values and not path.exists() and len(list(tmp_path.glob("est.json.invalid-*"))) == 1
    assert any("set aside" in n for n in est.notes)
