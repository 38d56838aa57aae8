"""Pure logic of the edge pipeline (the pipeline itself runs against real engines in tests/integration)."""

import grpc

from coinfer import types as t
from coinfer.edge.pipeline import cloud_failed, follow_advice, request_fault
from coinfer.edge.sampling import Sampling


def test_retry_advice_changes_exploration_and_keeps_the_users_limits():
    mine = Sampling(temperature=0.0, max_new_tokens=24, seed=7, stop=("\n\n",), n=3)
    advice = t.RetryAdvice(
        1,
        6,
        t.SamplingParams(temperature=0.6, top_p=0.9, presence_penalty=0.4, frequency_penalty=0.2, max_new_tokens=256),
        "regex_failed x3",
    )
    nxt = follow_advice(mine, advice)
    assert (nxt.n, nxt.temperature, nxt.top_p, nxt.presence_penalty, nxt.frequency_penalty) == (6, 0.6, 0.9, 0.4, 0.2)
    assert (nxt.max_new_tokens, nxt.seed, nxt.stop) == (24, 7, ("\n\n",))  # the user's budget, seed and stops
    roomy = follow_advice(Sampling(max_new_tokens=1000, n=3), advice)
    assert roomy.max_new_tokens == 256  # and never more than the cloud advises


def test_capacity_and_deadlines_do_not_count_against_the_cloud():
    from coinfer.edge.pipeline import failure_kind
    from coinfer.errors import Reason

    assert not cloud_failed(Reason.SESSIONS_FULL) and not cloud_failed(Reason.DEADLINE)
    assert not cloud_failed(failure_kind(TimeoutError()))  # the edge's own wait for the request's deadline
    assert cloud_failed(Reason.UNAVAILABLE) and cloud_failed(failure_kind(ConnectionError("stream ended")))
    bad = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), "request_id: at most 128 chars"
    )
    assert request_fault(bad)


def test_a_finished_draft_beats_a_truncated_one_with_a_better_score():
    from coinfer import types as t
    from coinfer.edge.pipeline import EdgePipeline
    from coinfer.rules import RuleSet
    from coinfer.tasks import OPEN

    cut = t.Draft(0, "Autumn wind, the leaves", 256, -0.649, truncated=True)
    done = t.Draft(1, "Autumn wind carries\nleaves across the quiet road\nthe year lets them go", 192, -0.668)
    best, valid, _ = EdgePipeline.local_answer(RuleSet([], OPEN, {}), [cut, done])
    assert best is done and valid
    loop = t.Draft(2, "a leaf's fate is determined " * 60, 512, -0.147)
    best, _, _ = EdgePipeline.local_answer(RuleSet([], OPEN, {}), [loop, cut])
    assert best is cut  # the loop fails the built-in repetition check


def test_the_result_builder_has_exactly_the_results_fields():
    import dataclasses

    from coinfer.edge.pipeline import EdgeResult, ResultBuilder

    assert [f.name for f in dataclasses.fields(ResultBuilder)] == [f.name for f in dataclasses.fields(EdgeResult)]


def test_a_failures_kind_is_a_reason_and_its_status_is_kept_apart():
    from coinfer.edge.kinds import FallbackKind
    from coinfer.edge.pipeline import failure_kind, failure_status
    from coinfer.errors import Reason, ResourceExhausted, status_of

    def rpc(code, details="x", trailing=()):
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)

    broken = rpc(grpc.StatusCode.INTERNAL, "Internal error from Core")  # no ErrorInfo: a broken transport
    assert failure_kind(broken) is FallbackKind.TRANSPORT and failure_status(broken) == "INTERNAL"
    gone = rpc(grpc.StatusCode.UNAVAILABLE)  # no ErrorInfo either: a status name is not a reason
    assert failure_kind(gone) is FallbackKind.TRANSPORT and failure_status(gone) == "UNAVAILABLE"
    full = status_of(ResourceExhausted("sessions: full", reason=Reason.SESSIONS_FULL))
    full = rpc(full.code, full.details, full.trailing_metadata)
    assert failure_kind(full) is FallbackKind.SESSIONS_FULL and not cloud_failed(failure_kind(full))
    assert failure_kind(rpc(grpc.StatusCode.DEADLINE_EXCEEDED)) is FallbackKind.DEADLINE
    assert failure_kind(TimeoutError()) is FallbackKind.DEADLINE and failure_status(TimeoutError()) == ""
    assert failure_kind(ConnectionError("no summary")) is FallbackKind.UNAVAILABLE
    assert cloud_failed(FallbackKind.TRANSPORT) and not cloud_failed(FallbackKind.CIRCUIT_OPEN)


def test_a_summarys_strings_become_the_edges_enums():
    from coinfer.edge.pipeline import ResultBuilder

    b = ResultBuilder()
    b.take(t.Summary(answer="8", source=t.AnswerSource.DRAFT, refine_mode="prefix", finish_reason=""))
    assert (b.refine_mode, b.finish_reason, b.source) == (t.RefineMode.PREFIX, t.FinishReason.STOP, "draft")
    b.take(t.Summary(answer="8", source=t.AnswerSource.CLOUD, refine_mode="", finish_reason="length"))
    assert b.refine_mode is None and b.finish_reason is t.FinishReason.LENGTH
    b.take(t.Summary(answer="8", source=t.AnswerSource.CLOUD, refine_mode="telepathy", finish_reason="moon"))
    assert b.refine_mode is None and b.finish_reason is t.FinishReason.STOP  # a newer cloud's: tolerated
