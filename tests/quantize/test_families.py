"""The draft families users deploy, as small random-weight models: export parity with torch over
16 decode steps (greedy match, max logit diff) through the same graph (issue 12)."""

import pytest
import torch

pytestmark = pytest.mark.slow

COMMON = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)


def _configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        "llama3-rope-tied": LlamaConfig(**COMMON, tie_word_embeddings=True, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}),
        "qwen2-qkv-bias": Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen3-qk-norm": Qwen3Config(**COMMON, head_dim=16),
        "mistral-sliding-window": MistralConfig(**COMMON, sliding_window=128),
    }


@pytest.mark.parametrize("name", list(_configs()))
def test_family_exports_with_parity(name, tmp_path):
    from transformers import AutoModelForCausalLM

    from quantize.export import export_dir

    cfg = _configs()[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # random weights give near-uniform logits: sharpen them so greedy is meaningful
        model.lm_head.weight.mul_(20.0) if not cfg.tie_word_embeddings else model.model.embed_tokens.weight.mul_(4.0)
    model.save_pretrained(str(tmp_path / "hf"))
    report = export_dir(tmp_path / "hf", tmp_path / "onnx", parity_prompt=list(range(3, 40)), parity_steps=16)
    par = report["parity"]
    assert par["greedy_match"] and par["max_logit_diff"] < 1e-2, (name, par)


def test_a_rope_scaling_that_depends_on_the_length_is_refused_by_name(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from quantize.export import ExportError, export_dir

    cfg = LlamaConfig(**COMMON, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    LlamaForCausalLM(cfg).save_pretrained(str(tmp_path / "hf"))
    with pytest.raises(ExportError, match=r"config.json: rope_type 'dynamic' unsupported"):
        export_dir(tmp_path / "hf", tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
