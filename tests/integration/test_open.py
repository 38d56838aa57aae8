"""Open requests on the real path: any prompt or conversation, declared extraction, verification
that can say no, refinement from candidate drafts (vLLM, ONNX Runtime INT8, gRPC over TCP)."""

from __future__ import annotations

import random

import grpc
import pytest

from coinfer import convert
from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.cloud.engine import metered
from coinfer.demo import wordprob
from coinfer.edge.pipeline import EdgePipeline, Plan
from coinfer.edge.sampling import Sampling
from coinfer.extract import Extraction
from coinfer.rules import Rule
from coinfer.v1 import coinfer_pb2 as pb

pytestmark = pytest.mark.slow
CONV = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", "Hello! How can I help?"),
]


@pytest.fixture(scope="module")
async def likelihood_cloud(cloud):
    """A cloud whose open requests are judged by the likelihood threshold (``PolicyConfig.verifier`` "likelihood":
    it may change the answer), over the session's one vLLM engine."""
    import dataclasses

    from coinfer.cloud.server import create_server

    cfg = dataclasses.replace(cloud.cfg, policy=dataclasses.replace(cloud.cfg.policy, verifier="likelihood"))
    srv = await create_server(cfg, cloud.core.engine)
    yield srv
    await srv.stop(grace=1.0, close_engine=False)


@pytest.fixture
async def likelihood_channel(likelihood_cloud):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{likelihood_cloud.port}") as ch:
        yield ch


@pytest.fixture
def likelihood_stub(likelihood_channel):
    from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

    return pb_grpc.CoinferCloudStub(likelihood_channel)


def _problem(seed: int = 3) -> wordprob.WordProblem:
    return next(wordprob.problems(random.Random(seed), held_out=True))


async def _session(stub, req: t.OpenRequest, drafts: list[str]) -> list:
    async def gen():
        yield pb.EdgeMessage(open=convert.open_to_pb(req))
        for i, text in enumerate(drafts):
            yield pb.EdgeMessage(draft=pb.Draft(index=i, text=text, num_tokens=len(text.split())))
        yield pb.EdgeMessage(done=pb.DraftsDone(count=len(drafts)))

    return [convert.event_from_pb(m) async for m in stub.Session(gen(), timeout=120)]


async def test_open_session_verifies_extracts_and_answers(likelihood_stub):
    stub = likelihood_stub
    p = _problem()
    wrong = wordprob.corrupt(p.solution, random.Random(1))
    req = t.OpenRequest(
        request_id="open-1",
        task="",
        prompt="",
        rules=[Rule("arithmetic")],
        messages=[*CONV, ChatMessage("user", p.prompt)],
        extraction=Extraction("marker"),
    )
    events = await _session(stub, req, [p.solution, "I am not sure.", wrong, p.solution + " "])
    accepted, verdicts, summary = events[0], [e for e in events if isinstance(e, t.Verdict)], events[-1]
    assert isinstance(accepted, t.SessionAccepted) and accepted.rules == ["arithmetic"]
    by = {v.draft_index: v for v in verdicts}
    assert by[1].failed_rule == "parse" and "Answer:" in by[1].error  # extraction is the first rule
    assert by[3].duplicate_of == 1  # same text (whitespace aside): verified once
    assert isinstance(summary, t.Summary) and summary.answer_valid
    # under the arithmetic rule a doubted best draft gives the cloud's own checked answer, not candidates
    # (SessionContext.own_over_candidates); a draft whose only slip is a computed value is judged repaired
    assert summary.refine_mode in ("accepted", "repaired", "alone")
    if summary.refine_mode == "accepted":  # the target found the right solution likely enough
        assert 0 in summary.chosen_drafts and summary.answer == p.solution
    assert summary.fields["answer"] == wordprob.parse_answer(summary.answer)
    assert summary.prompt_tokens > 0 and summary.answer_tokens > 0
    keys = ("best draft not as is", "no valid draft", "accepted as is", "accepted with its computed values repaired")
    assert any(k in summary.trace for k in keys)


async def test_exact_verification_answers_what_the_cloud_plan_writes_and_counts_the_draft_tokens_it_took(stub):
    p = _problem()
    req = t.OpenRequest(
        request_id="open-x", task="", prompt=p.prompt, rules=[Rule("arithmetic")], extraction=Extraction("marker")
    )
    alone = [
        convert.event_from_pb(m) async for m in stub.Generate(pb.GenerateRequest(problem=convert.problem_to_pb(req)))
    ]
    events = await _session(stub, req, [alone[-1].answer])  # a draft that is the target's own answer
    summary = events[-1]
    assert summary.refine_mode == "exact" and summary.answer == alone[-1].answer
    assert summary.cost.draft_tokens_accepted == summary.cost.draft_tokens_offered > 0
    # the check's own next token, and the end of turn where the draft's was not taken: nothing more decoded
    assert summary.cost.decoded_tokens <= 2 and summary.cost.decoded_tokens < len(summary.answer.split())


async def test_a_check_the_prefix_cache_served_reads_the_rows_an_earlier_check_kept(cloud):
    # vLLM writes no prompt-logprob row where its prefix cache served a position: a check of tokens an earlier one
    # computed used to be asked again without the cache (a second request, the prompt recomputed)
    engine = cloud.core.engine
    ids = await engine.prompt_ids(engine.render([ChatMessage("user", _problem(7).prompt)]))
    draft = await engine.text_ids(" The answer is 42 because 6 * 7 = 42, and 42 is what was asked." * 4)
    first = await engine.top_tokens(ids + draft, len(ids), "kept-1")
    cost = metered()
    again = await engine.top_tokens(ids + draft, len(ids), "kept-2")
    assert cost.engine_requests == 1 and cost.cached_tokens >= len(ids) + 32  # past the prompt, into the draft
    assert again[0] == first[0] and again[1] == pytest.approx(first[1], abs=0.05)


async def test_likelihood_threshold_can_say_no(likelihood_stub):
    stub = likelihood_stub
    p = _problem(5)
    req = t.OpenRequest(request_id="open-2", task="", prompt=p.prompt, extraction=Extraction("marker"))
    gibberish = "zebra quantum " * 6 + "\nAnswer: 3"
    events = await _session(stub, req, [gibberish])
    (v,) = [e for e in events if isinstance(e, t.Verdict)]
    assert not v.valid and v.failed_rule == "likelihood" and v.error.startswith("low_likelihood: mean logprob")


async def test_generate_accepts_a_conversation_and_zero_means_default(stub):
    msg = pb.GenerateRequest(
        problem=pb.Problem(messages=[pb.ChatMessage(role="user", content="Explain why the sky is blue.")]),
        sampling=pb.SamplingParams(temperature=0.5),
    )  # only temperature: 0 means default elsewhere
    events = [convert.event_from_pb(m) async for m in stub.Generate(msg, timeout=120)]
    summary = events[-1]
    assert isinstance(summary, t.Summary) and summary.source == t.AnswerSource.CLOUD
    assert summary.refine_mode == "alone" and summary.answer
    assert "no drafts (cloud plan)" in summary.trace  # not "no valid draft after retries": there were none


@pytest.mark.parametrize(
    "problem,code,fragment",
    [
        (
            pb.Problem(prompt="q", messages=[pb.ChatMessage(role="user", content="q")]),
            "INVALID_ARGUMENT",
            "problem.prompt",
        ),
        (
            pb.Problem(messages=[pb.ChatMessage(role="robot", content="q")]),
            "INVALID_ARGUMENT",
            "problem.messages[0].role",
        ),
        (
            pb.Problem(
                messages=[pb.ChatMessage(role="user", content="q"), pb.ChatMessage(role="assistant", content="a")]
            ),
            "INVALID_ARGUMENT",
            "problem.messages[1].role",
        ),
        (
            pb.Problem(prompt="q", extraction=pb.Extraction(kind=pb.EXTRACTION_KIND_REGEX, pattern="(")),
            "INVALID_ARGUMENT",
            "problem.extraction.pattern",
        ),
        (pb.Problem(prompt="q", extraction=pb.Extraction(kind=42)), "INVALID_ARGUMENT", "problem.extraction.kind"),
        (
            pb.Problem(prompt="q", rules=[pb.Rule(kind="task_check")]),
            "INVALID_ARGUMENT",
            "problem.rules[0].params.check",
        ),
    ],
)
async def test_bad_open_requests_name_the_field(stub, problem, code, fragment):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        [m async for m in stub.Generate(pb.GenerateRequest(problem=problem), timeout=60)]
    assert e.value.code().name == code and fragment in e.value.details(), e.value.details()


async def test_status_names_the_model_not_its_path(stub, cloud):
    st = await stub.Status(pb.StatusRequest())
    assert st.model == "target" and "/" not in st.model


async def test_split_over_int8_edge_for_a_word_problem(int8_draft, likelihood_channel):
    """Draft tokenizer (edge) and target tokenizer (cloud) are separate models' own; drafts travel as text."""
    from coinfer.edge.draft_engine import OrtDraftEngine

    edge = OrtDraftEngine(int8_draft)
    pipe = EdgePipeline(edge, likelihood_channel)
    p = _problem(7)
    res = await pipe.solve(
        "",
        p.prompt,
        [Rule("arithmetic")],
        Sampling(n=4, seed=1),
        Plan.SPLIT,
        60.0,
        extraction=Extraction("marker"),
        refine=t.SamplingParams(temperature=0.0, stop=("\n\n\n",)),
    )
    assert res.summary is not None and not res.fallback_reason and res.valid
    assert res.refine_mode in ("accepted", "repaired", "alone") and "answer" in res.fields
    assert sorted(res.verdicts) == sorted(d.index for d in res.drafts)
