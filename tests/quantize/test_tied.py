"""A head tied to the embedding table is quantized like every other weight, and a model whose
head stayed float fails the structure check."""

import json

import onnx
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tied_export(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from coinfer.quantize.export import export_dir

    root = tmp_path_factory.mktemp("tied")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(str(root / "hf"))
    report = export_dir(root / "hf", root / "onnx", parity_prompt=[1, 5, 9, 13], parity_steps=4)
    assert report["parity"]["greedy_match"]  # the untied copy of the head computes the same logits
    return root


def test_tied_head_is_quantized_per_channel(tied_export):
    from coinfer.quantize.build import BuildOptions, int8_dir
    from coinfer.quantize.int8 import QuantConfig

    out = tied_export / "int8"
    report = int8_dir(
        tied_export / "onnx", out, QuantConfig(scheme="dynamic"), BuildOptions(gates=None, progress=False)
    )
    structure = report["structure"]
    assert structure["problems"] == [] and structure["weights_checked"] == 7 * 2 + 1  # 7 per layer + the head
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["checks"]["structure"]["quantized_weights"]) == 15


def test_a_head_left_float_fails_the_structure_check(tied_export, tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from coinfer.quantize.check import check_structure
    from coinfer.quantize.int8 import _named, weight_matmuls

    named = _named(tied_export / "onnx" / "model.onnx", tmp_path / "named.onnx")
    nodes = weight_matmuls(named)
    head = nodes[-1]  # the LM head is the graph's last weight MatMul
    quantize_dynamic(
        str(tmp_path / "named.onnx"),
        str(tmp_path / "q.onnx"),
        per_channel=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        nodes_to_quantize=nodes[:-1],
    )
    checked, problems = check_structure(tmp_path / "q.onnx")
    assert checked == 14 and any(head in p and "stayed float" in p for p in problems), problems
    assert onnx.load(str(tmp_path / "q.onnx")) is not None
