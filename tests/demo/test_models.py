"""The built demo models: accuracy targets, and both load in vLLM and transformers."""

import asyncio

import pytest

pytestmark = pytest.mark.slow


def test_accuracy_targets_measured_on_held_out_problems(artifacts):
    r = artifacts.models.report
    draft, target = r["draft"]["accuracy"]["overall"], r["target"]["accuracy"]["overall"]
    assert 0.30 <= draft <= 0.70, r["draft"]["accuracy"]
    assert target >= draft + 0.15, (draft, target)
    assert r["draft"]["params"] < r["target"]["params"]


def test_both_models_load_in_transformers_and_vllm(artifacts):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from cloud.config import EngineConfig
    from cloud.engine import GenParams, VllmEngine

    for path in (artifacts.models.draft, artifacts.models.target):
        model = LlamaForCausalLM.from_pretrained(str(path))
        assert model.config.architectures == ["LlamaForCausalLM"]
        assert AutoTokenizer.from_pretrained(str(path)).chat_template

    async def vllm_answers() -> str:
        eng = await VllmEngine(EngineConfig(model=str(artifacts.models.draft))).start()
        try:
            out = [d async for d in eng.generate("If x=2 and y=3, compute x*y+x+y.\n", GenParams(max_tokens=40), "t")]
        finally:
            await eng.close()
        assert all(c.tokens >= 1 for c in out)  # every chunk says what it cost
        return "".join(c.text for c in out)

    text = asyncio.run(vllm_answers())
    assert "answer" in text, text
