"""The built demo models: accuracy targets, chat template, and both load in vLLM and transformers."""

import pytest

pytestmark = pytest.mark.slow


def test_shipped_pair_matches_the_recipe_and_its_digests():
    """The committed weights are the ones the current recipe trains (else: `make models` and commit)."""
    from coinfer.demo.models import ensure_models
    from coinfer.demo.train import pair_key

    models = ensure_models(verify=True)  # every file's sha256 against report.json
    assert models.report["key"] == pair_key(), "demo/weights was trained under another recipe: run `make models`"
    assert models.report["draft"]["params"] < models.report["target"]["params"]
    assert {"draft/model.safetensors", "target/model.safetensors"} <= models.report["files"].keys()


def test_shipped_pair_meets_its_goals_measured_here(artifacts):
    """Held-out greedy accuracy re-measured on this machine (transformers, float32, 300 problems, as
    `python -m coinfer.demo.evaluate`). Shipped (report.json): draft 0.31 / 0.23 / 0.33, target 0.88 / 0.61 /
    0.93 (arith / select / words): every goal below holds there by at least 18 points, so CPU rounding
    (AVX2 vs AVX512 kernels flip a few greedy tokens) cannot decide it; the re-measurement must also
    stay within 0.08 of what was shipped (the same weights everywhere)."""
    from coinfer.demo.evaluate import accuracy
    from coinfer.demo.train import Recipe

    recipe, shipped = Recipe(), artifacts.models.report["eval"]
    draft, target = accuracy(artifacts.models.draft, recipe), accuracy(artifacts.models.target, recipe)
    for task in recipe.tasks:
        assert target[task] >= draft[task] + 0.20, (task, draft, target)
        assert abs(draft[task] - shipped["draft"][task]) <= 0.08 and abs(target[task] - shipped["target"][task]) <= 0.08
    assert target["words"] >= 0.60 and draft["words"] <= 0.60, (draft, target)


def test_a_changed_weight_file_is_refused(tmp_path):
    import shutil

    from coinfer.demo.models import ShippedWeightsError, ensure_models
    from coinfer.demo.train import SHIPPED

    copy = tmp_path / "weights"
    shutil.copytree(SHIPPED, copy)
    with open(copy / "draft" / "config.json", "a") as f:
        f.write("\n")
    with pytest.raises(ShippedWeightsError, match="draft/config.json"):
        ensure_models(copy)


def test_models_speak_chatml_and_stop_at_end_of_turn(artifacts):
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig

    from coinfer.chat import ChatFormat, ChatMessage

    for path in (artifacts.models.draft, artifacts.models.target):
        tok = AutoTokenizer.from_pretrained(str(path))
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        assert tok.eos_token_id == eos and LlamaConfig.from_pretrained(str(path)).eos_token_id == eos
        assert GenerationConfig.from_pretrained(str(path)).eos_token_id == eos
        text = ChatFormat.from_dir(path).render([ChatMessage("user", "If x=2 and y=3, compute x*y+x+y.")])
        assert text == tok.apply_chat_template(
            [{"role": "user", "content": "If x=2 and y=3, compute x*y+x+y."}],
            tokenize=False,
            add_generation_prompt=True,
        )


def test_both_models_load_in_transformers_and_vllm(artifacts, offline_vllm):
    """Both load in transformers; the draft in vLLM too (the target is the session's cloud engine)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from coinfer.chat import ChatFormat, ChatMessage
    from coinfer.cloud.config import EngineConfig

    for path in (artifacts.models.draft, artifacts.models.target):
        model = LlamaForCausalLM.from_pretrained(str(path))
        assert model.config.architectures == ["LlamaForCausalLM"]
        assert model.config.head_dim in (32, 64) and not model.config.tie_word_embeddings
        assert AutoTokenizer.from_pretrained(str(path)).chat_template

    tok = AutoTokenizer.from_pretrained(str(artifacts.models.draft))
    prompt = ChatFormat.from_dir(artifacts.models.draft).render(
        [ChatMessage("user", "If x=2 and y=3, compute x*y+x+y.")]
    )
    ids = offline_vllm.greedy(
        EngineConfig(model=str(artifacts.models.draft)), tok(prompt, add_special_tokens=False)["input_ids"], 40
    )
    text = tok.decode(ids, skip_special_tokens=True)
    assert "answer" in text, text


def test_draft_and_target_have_different_tokenizers(artifacts):
    """Real deployments pair a Qwen draft with a Llama target: drafts travel as text, so the demo
    pair deliberately does not share a vocabulary."""
    from transformers import AutoTokenizer

    draft, target = (AutoTokenizer.from_pretrained(str(p)) for p in (artifacts.models.draft, artifacts.models.target))
    assert len(draft) != len(target)
    text = "Altogether she sold 48 + 24 = 72 clips.\nAnswer: 72"
    assert draft(text)["input_ids"] != target(text)["input_ids"]
    assert draft.decode(draft(text, add_special_tokens=False)["input_ids"]) == text
    assert target.decode(target(text, add_special_tokens=False)["input_ids"]) == text
