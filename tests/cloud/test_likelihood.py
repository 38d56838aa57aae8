"""The likelihood verifier scores a draft's exact token span in the rendered conversation: equal to
transformers' sum of the same tokens' logprobs, and unbiased by a BPE merge at the boundary."""

from __future__ import annotations

import math

import pytest

from coinfer.chat import ChatMessage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def fp32_engine(artifacts):
    """float32 so that vLLM and transformers compute the same numbers (auto is bf16 on bf16 CPUs)."""
    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.vllm_engine import VllmEngine

    eng = await VllmEngine(EngineConfig(model=str(artifacts.target), dtype="float32")).start()
    yield eng
    await eng.close()


def _transformers_logprobs(model_dir, ids: list[int], start: int) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[pos - 1, ids[pos]]) for pos in range(start, len(ids))]


def _merging_split(tok) -> tuple[str, str]:
    """A word the tokenizer writes as one token, cut in two: the two halves merge back when the
    text is tokenized whole, and do not when tokenized apart."""
    for word in (" clips", " apples", " stickers", " pencils", " cookies", " marbles", " altogether", " friends"):
        ids = tok(word, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            cut = len(word) // 2
            return word[:cut], word[cut:]
    raise AssertionError("no single-token word found in the demo vocabulary")


async def test_score_is_the_exact_span_sum_under_transformers(fp32_engine, artifacts):
    eng = fp32_engine
    prompt = eng.render(
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Natalia sold 48 clips in April and half as many in May. How many in all?"),
        ]
    )
    draft = "In May she sold 48 / 2 = 24 clips.\nAltogether she sold 48 + 24 = 72 clips.\nAnswer: 72"
    lps = await eng.continuation_logprobs(prompt, draft, "lik-1")
    ids, start = eng.span_ids(prompt, draft)
    ids = ids + [eng._tok.eos_token_id]  # the end of the turn is scored too
    ref = _transformers_logprobs(artifacts.target, ids, start)
    assert len(lps) == len(ref) == len(ids) - start
    assert math.isclose(sum(lps), sum(ref), abs_tol=1e-3 * len(ref)), (sum(lps), sum(ref))


async def test_a_merge_at_the_boundary_is_scored_as_the_model_reads_it(fp32_engine, artifacts):
    eng = fp32_engine
    head, tail = _merging_split(eng._tok)
    prompt = eng.render([ChatMessage("user", "What did she sell?")]) + "She sold 24" + head
    draft = tail + ".\nAnswer: 24"
    ids, start = eng.span_ids(prompt, draft)
    whole = eng._tok(prompt + draft, add_special_tokens=False)["input_ids"]
    apart = (
        eng._tok(prompt, add_special_tokens=False)["input_ids"] + eng._tok(draft, add_special_tokens=False)["input_ids"]
    )
    assert ids == whole and ids != apart  # the naive concatenation is a sequence the model never saw
    # the straddling token belongs to the draft: its logprob is scored once, in context
    assert eng._tok.decode([ids[start]]) == head + tail
    lps = await eng.continuation_logprobs(prompt, draft, "lik-2")
    ref = _transformers_logprobs(artifacts.target, ids + [eng._tok.eos_token_id], start)
    assert math.isclose(sum(lps), sum(ref), abs_tol=1e-3 * len(ref))
