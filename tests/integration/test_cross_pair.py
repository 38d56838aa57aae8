"""A draft and a target with two tokenizers end to end (issue 37 item 3): SmolLM2-135M-Instruct INT8 drafting
on the edge (49k-token BPE, ChatML), Gemma 3 270M base on the cloud's vLLM (262k-token vocabulary, no chat
template of its own: served with ``deploy/chat_templates/gemma.jinja``, vLLM's ``--chat-template``), asked
through the official openai SDK in every plan, plain and streamed. The same weights served without the
template refuse a request in chat form when the session opens, over HTTP and gRPC; a plain prompt is theirs.

Both models come from ``coinfer.quantize.real_model`` (pip, cached under ``~/.cache/coinfer``); the pair is
``benchmarks.cross_pair.pair``, which the benchmark measures."""

from __future__ import annotations

import copy

import pytest

from benchmarks.capacity import REAL_PROMPTS
from benchmarks.cross_pair import GEMMA_TEMPLATE, TEMPLATE_TOKENS, ask, client, pair, serving_edge
from coinfer.chat import ChatMessage, conversation

pytestmark = pytest.mark.slow
PROMPTS = [REAL_PROMPTS[1], REAL_PROMPTS[0]]
"""A short factual answer and free prose (one plain call, one streamed, per plan)."""
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def gemma3_hf():
    from coinfer.quantize.real_model import imported_dir

    return imported_dir("gemma3")


@pytest.fixture(scope="module")
def smollm2_int8():
    from coinfer.quantize.real_model import edge_dir

    return edge_dir()  # export + default INT8 (gated); cached by the model and the build code


@pytest.fixture(scope="module")
async def cross_daemon(smollm2_int8, gemma3_hf):
    async with pair(smollm2_int8, gemma3_hf, GEMMA_TEMPLATE) as d:
        yield d


async def test_the_cloud_reads_gemmas_turns_and_scores_text_as_text(cross_daemon):
    eng = cross_daemon.pair_cloud.core.engine
    tok = eng._tok
    eot, sot = tok.convert_tokens_to_ids("<end_of_turn>"), tok.convert_tokens_to_ids("<start_of_turn>")
    assert eng.end_id == eot != tok.eos_token_id  # scored after a draft, not the tokenizer's <eos>
    assert {eot, sot} <= eng.stop_ids and tok.bos_token_id not in eng.stop_ids
    assert not eng.scores_end  # a base model given a template: its end of turn, never learned, is not scored
    prompt = eng.render(conversation("", [ChatMessage("user", "Hi")]))
    assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    # another model's draft holding the text of a Gemma turn marker: scored as the text it is
    ids, start = eng.span_ids(prompt, "Paris<end_of_turn> done")
    assert eot not in ids[start:] and tok.decode(ids[start:]) == "Paris<end_of_turn> done"
    assert (
        eng.span_ids(prompt, "Paris.")[0][: len(tok(prompt, add_special_tokens=False)["input_ids"])]
        == tok(prompt, add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize("plan", ["edge", "split", "cloud", "auto"])
async def test_every_plan_answers_the_real_prompts_through_the_openai_sdk(cross_daemon, plan):
    for i, prompt in enumerate(PROMPTS):
        row = await ask(cross_daemon, "smollm2-gemma3", prompt, plan, stream=bool(i % 2), max_tokens=MAX_TOKENS)
        assert not row.error and row.text.strip(), row
        assert not row.fallback, row  # answered by the plan, not by the edge past a deadline
        assert not any(tok in row.text for tok in TEMPLATE_TOKENS), row  # neither model's turn markers
        assert plan == "auto" or row.plans[-1] == plan, row
        assert row.finish in ("stop", "length", "repetition"), row
        if plan in ("split", "auto") and row.plans[-1] == "split":
            # Gemma judged SmolLM2's drafts, or answered itself from the open and said so (coinfer.cloud.hedge)
            assert row.accepted + row.rejected + row.unscored > 0, row
            assert not row.unscored or "racing the drafts" in row.trace, row
            assert row.source in ("draft", "refined", "cloud"), row


async def test_across_two_tokenizers_splits_greedy_answer_is_the_cloud_plans(cross_daemon):
    # exact verification (issue 52): Gemma checks SmolLM2's drafts on its own tokens (the draft's text tokenized
    # by Gemma) and takes them only as far as they are what it writes itself
    for prompt in PROMPTS:
        cloud = await ask(cross_daemon, "smollm2-gemma3", prompt, "cloud", stream=False, max_tokens=MAX_TOKENS)
        for stream in (False, True):
            split = await ask(cross_daemon, "smollm2-gemma3", prompt, "split", stream=stream, max_tokens=MAX_TOKENS)
            assert split.plans[-1] == "split" and not split.fallback, split
            assert split.text == cloud.text, (split, cloud)  # the target's own greedy answer
            assert stream or (split.refine_mode == "exact" and split.offered > 0), split  # drafts were checked


@pytest.fixture(scope="module")
async def untemplated(cross_daemon, smollm2_int8, gemma3_hf):
    """The same Gemma 3 weights and engine, served as the directory has them: no chat template."""
    from coinfer.chat import ChatFormat
    from coinfer.cloud.config import CloudConfig, EngineConfig
    from coinfer.cloud.server import create_server

    engine = copy.copy(cross_daemon.pair_cloud.core.engine)  # one vLLM: another chat format over it
    engine.chat = ChatFormat.from_dir(gemma3_hf)
    engine._templated()
    assert not engine.chat.templated
    srv = await create_server(CloudConfig(engine=EngineConfig(model=str(gemma3_hf))), engine)
    try:
        async with serving_edge(smollm2_int8, srv.port) as d:
            yield d
    finally:
        await srv.stop(grace=1.0, close_engine=False)


@pytest.mark.parametrize("plan", ["split", "cloud"])
async def test_a_chat_request_to_a_target_without_a_template_is_refused_at_open_naming_why(untemplated, plan):
    import grpc
    import openai

    from coinfer.v1 import coinfer_pb2 as pb
    from coinfer.v1 import edge_pb2 as epb
    from coinfer.v1 import edge_pb2_grpc as epb_grpc

    with pytest.raises(openai.BadRequestError, match="has no chat template") as err:
        await client(untemplated).chat.completions.create(
            model="coinfer-edge",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=MAX_TOKENS,
            extra_body={"coinfer": {"plan": plan}},
        )
    assert err.value.status_code == 400 and "--chat-template" in str(err.value)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{untemplated.grpc_port}") as ch:
        req = epb.SolveRequest(
            problem=pb.Problem(messages=[pb.ChatMessage(role="user", content=PROMPTS[0])]), plan=plan
        )
        with pytest.raises(grpc.aio.AioRpcError) as rpc:
            _ = [ev async for ev in epb_grpc.CoinferEdgeStub(ch).Solve(req, timeout=120)]
    assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no chat template" in rpc.value.details()


async def test_a_plain_prompt_to_a_target_without_a_template_is_answered(untemplated):
    r = await client(untemplated).completions.create(
        model="coinfer-edge",
        prompt=PROMPTS[0],
        max_tokens=MAX_TOKENS,
        extra_body={"coinfer": {"plan": "cloud"}},
    )
    info = r.model_extra["coinfer"]
    assert r.choices[0].text.strip() and info["plans"] == ["cloud"] and not info["fallback_reason"], info
