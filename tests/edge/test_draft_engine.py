"""Batched drafting on the real ONNX Runtime session of the demo draft model."""

import shutil

import pytest

from coinfer.chat import ChatMessage
from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.sampling import Sampling
from coinfer.manifest import ManifestError

pytestmark = pytest.mark.slow
QUESTION = "If x=4 and y=7, compute x*y+x+y."


def chat(engine: OrtDraftEngine, question: str = QUESTION) -> str:
    """The question as the draft model reads it: rendered with its own chat template."""
    return engine.render([ChatMessage("user", question)])


def test_batch_equals_per_draft_runs_with_the_same_seeds(draft_engine):
    s = Sampling(n=4, seed=100, temperature=0.8)
    batch = draft_engine.generate(chat(draft_engine), s)
    assert [d.index for d in sorted(batch, key=lambda d: d.index)] == [0, 1, 2, 3]
    for d in batch:
        alone = draft_engine.generate(chat(draft_engine), Sampling(n=1, seed=100 + d.index, temperature=0.8))[0]
        assert alone.token_ids == d.token_ids
        assert alone.mean_logprob == pytest.approx(d.mean_logprob, abs=1e-4)


def test_drafts_are_handed_over_as_they_finish(draft_engine):
    seen = []
    out = draft_engine.generate(chat(draft_engine), Sampling(n=5, seed=3, temperature=1.0), on_draft=seen.append)
    assert sorted(d.index for d in seen) == [d.index for d in out]
    assert [d.num_tokens for d in seen] == sorted(d.num_tokens for d in seen)
    assert all(d.finish_reason in ("stop", "length") for d in seen)
    assert all(d.mean_logprob <= 0 for d in seen)


def test_token_budget_and_stop_strings(draft_engine):
    (d,) = draft_engine.generate(chat(draft_engine), Sampling(n=1, temperature=0.0, max_new_tokens=3))
    assert d.num_tokens == 3 and d.finish_reason == "length"
    (d,) = draft_engine.generate(chat(draft_engine), Sampling(n=1, temperature=0.0, stop=(";",)))
    assert ";" not in d.text and d.finish_reason == "stop"


def test_a_deadline_mid_draft_returns_every_draft_truncated_there(draft_engine):
    calls = []

    def deadline() -> bool:  # true from the 5th step on: the request's deadline arrived mid-draft
        calls.append(1)
        return len(calls) > 4

    out = draft_engine.generate(chat(draft_engine), Sampling(n=3, seed=1, max_new_tokens=64), cancelled=deadline)
    assert sorted(d.index for d in out) == [0, 1, 2]  # none dropped
    # cut at the deadline (a draft that ended by itself within 4 tokens would say "stop")
    assert all(
        (d.finish_reason, d.num_tokens) == ("length", 4) or (d.finish_reason == "stop" and d.num_tokens <= 4)
        for d in out
    )


def test_greedy_drafts_are_identical(draft_engine):
    out = draft_engine.generate(
        chat(draft_engine), Sampling(n=3, temperature=0.0, presence_penalty=0, frequency_penalty=0)
    )
    assert len({d.text for d in out}) == 1


def test_loader_refuses_a_tampered_model(artifacts, tmp_path):
    src = artifacts.draft_onnx
    d = tmp_path / "copy"
    shutil.copytree(src, d)
    with (d / "model.onnx").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00\x00\x00\x00")
    with pytest.raises(ManifestError, match="model.onnx"):
        OrtDraftEngine(d)
    (d / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="manifest.json: missing"):
        OrtDraftEngine(d)


def test_io_binding_path_keeps_the_cache_in_ort_values_and_matches(artifacts, draft_engine):
    """The CUDA path (device-resident KV cache through IO binding), exercised on CPU OrtValues."""
    bound = OrtDraftEngine(artifacts.draft_onnx, io_binding=True)
    assert bound.lm.io_binding
    s = Sampling(n=4, temperature=0.8, presence_penalty=0.0, frequency_penalty=0.0, seed=11, max_new_tokens=40)
    prompt = chat(draft_engine, "If x=3 and y=5, compute (x+y)^2-x*y.")
    a = [(d.index, d.text, d.token_ids) for d in draft_engine.generate(prompt, s)]
    b = [(d.index, d.text, d.token_ids) for d in bound.generate(prompt, s)]
    assert sorted(a) == sorted(b)


def test_int8_batch_equals_per_draft_runs_exactly(int8_draft):
    """The edge's INT8 (static) draft: calibrated activation scales make every row independent."""
    eng = OrtDraftEngine(int8_draft)
    for k, q in enumerate([QUESTION, "Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8."]):
        prompt = chat(eng, q)
        batch = eng.generate(prompt, Sampling(n=4, seed=10 * k, temperature=0.8))
        for d in batch:
            alone = eng.generate(prompt, Sampling(n=1, seed=10 * k + d.index, temperature=0.8))[0]
            assert alone.token_ids == d.token_ids and alone.mean_logprob == pytest.approx(d.mean_logprob, abs=1e-6)
