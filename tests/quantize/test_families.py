"""The draft families users deploy, end to end on small random-weight models with a BPE tokenizer and
their chat template: export parity with torch over 16 decode steps, every weight INT8 per
channel in each scheme (a tied head included), gates that judge a model without tasks, the edge
drafting 5 drafts for a free-form chat prompt with stop strings, and vLLM serving the same directory."""

import json

import pytest
import torch

from tests.families import FAMILIES, build

pytestmark = pytest.mark.slow
SCHEMES = ("dynamic", "static", "weight-only")
LONG_TURN = (
    "Explain how a rainbow forms, step by step, then list three uses of a paperclip and answer in JSON "
    "with keys name and age. 用一句话介绍长城。"
)


def _linear_count(model_dir, fused: bool = False) -> int:
    """Weight MatMuls the export must quantize: every nn.Linear of the HF model (a tied head included);
    ``fused`` (the buffer graph): key and value share the query's MatMul, up the gate's."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir))
    joined = (".k_proj", ".v_proj", ".up_proj") if fused else ()
    return sum(isinstance(m, torch.nn.Linear) and not name.endswith(joined) for name, m in hf.named_modules())


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """name, root: root/hf (source), root/onnx (export, parity checked), root/<scheme> (INT8)."""
    from transformers import AutoTokenizer

    from coinfer.chat import ChatFormat, ChatMessage
    from coinfer.quantize.build import BuildOptions, int8_dir
    from coinfer.quantize.export import export_dir
    from coinfer.quantize.int8 import QuantConfig

    name, root = request.param, tmp_path_factory.mktemp(request.param)
    hf = build(name, root / "hf")
    text = ChatFormat.from_dir(hf).render([ChatMessage("user", LONG_TURN)])  # longer than the sliding windows
    ids = AutoTokenizer.from_pretrained(str(hf))(text, add_special_tokens=False)["input_ids"]
    export_dir(hf, root / "onnx", parity_prompt=ids, parity_steps=16)
    for scheme in SCHEMES:  # structure-checked here; the gates have their own test
        int8_dir(
            root / "onnx",
            root / scheme,
            QuantConfig(scheme=scheme, calib_prompts=8),
            BuildOptions(gates=None, progress=False),
        )
    return name, root


def test_export_matches_torch_over_16_decode_steps(family):
    name, root = family
    report = json.loads((root / "onnx" / "export.json").read_text())
    par = report["parity"]
    print(f"{name}: parity max logit diff {par['max_logit_diff']:.2e} over {par['decode_steps']} steps")
    assert par["greedy_match"] and par["max_logit_diff"] < 1e-3, (name, par)
    assert report["logits"] == "last"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_weight_is_int8_per_channel(family, scheme):
    from coinfer.quantize.check import check_structure

    name, root = family
    expected = _linear_count(root / "hf")  # Phi-3's fused qkv / gate_up: 4 per layer, the others 7; + head
    checked, problems = check_structure(root / scheme / "model.onnx")
    assert problems == [] and checked == expected, (name, scheme, checked, expected, problems)
    manifest = json.loads((root / scheme / "manifest.json").read_text())
    assert len(manifest["checks"]["structure"]["quantized_weights"]) == expected and manifest["checks"]["passed"]


def test_the_gates_judge_a_model_without_tasks(family):
    """Generic prompts (no task declared): the task-free gates measure, the accuracy gate says it cannot
    judge. Thresholds with margin for every CPU: random weights give flat rows where rounding flips
    argmaxes, so greedy match is only reported (static INT8 with 7-bit weights, as on AVX2 CPUs without
    VNNI, measured: top-1 >= 0.91, NLL delta <= 0.03, KL <= 0.013, greedy match down to 0.125)."""
    from coinfer.quantize.gates import GateConfig, gate_dirs

    name, root = family
    results = {
        r.name: r
        for r in gate_dirs(root / "onnx", root / "static", GateConfig(prompts=8, max_new_tokens=16), progress=False)
    }
    assert results["top1_agreement"].value >= 0.85, results["top1_agreement"].message
    assert results["nll_delta"].value <= 0.1, results["nll_delta"].message
    assert results["kl_divergence"].value <= 0.05, results["kl_divergence"].message
    assert results["greedy_match"].value is not None
    assert results["accuracy_drop"].value is None and "not applicable" in results["accuracy_drop"].message


def test_edge_drafts_five_for_a_chat_prompt_and_honours_stop_strings(family):
    from coinfer.chat import ChatMessage
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.sampling import Sampling

    name, root = family
    engine = OrtDraftEngine(root / "static")  # static INT8: batch-invariant, so a row's tokens ignore its batch-mates
    prompt = engine.render([ChatMessage("system", "You are terse."), ChatMessage("user", "Write a haiku about rain.")])
    s = Sampling(
        n=5, temperature=1.0, top_p=1.0, presence_penalty=0.0, frequency_penalty=0.0, max_new_tokens=24, seed=7
    )
    free = engine.generate(prompt, s)
    assert [d.index for d in free] == list(range(5))
    longest = max(free, key=lambda d: len(d.text)).text
    assert longest, name
    stop = longest[len(longest) // 2]  # a character some draft writes: the stop must cut it there
    cut = engine.generate(prompt, Sampling(**{**s.__dict__, "stop": (stop,)}))
    assert len(cut) == 5
    for a, b in zip(free, cut):
        assert stop not in b.text
        if stop in a.text:
            assert b.text == a.text[: a.text.index(stop)] and b.finish_reason == "stop", (name, a.text, b.text)
        else:
            assert b.text == a.text


def test_vllm_serves_the_same_directory(family, offline_vllm):
    """vLLM, with the cloud engine's arguments, loads the source directory and decodes what transformers
    decodes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coinfer.chat import ChatFormat, ChatMessage
    from coinfer.cloud.config import EngineConfig

    name, root = family
    prompt = ChatFormat.from_dir(root / "hf").render([ChatMessage("user", "Hi")])  # short: inside every sliding window
    ids = AutoTokenizer.from_pretrained(str(root / "hf"))(prompt, add_special_tokens=False)["input_ids"]
    served_ids = offline_vllm.greedy(EngineConfig(model=str(root / "hf"), dtype="float32"), ids, 8)  # ids, not text
    hf = AutoModelForCausalLM.from_pretrained(str(root / "hf"), dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():  # transformers' logits along vLLM's greedy path
        logits = hf(torch.tensor([ids + served_ids])).logits[0, len(ids) - 1 : -1]
    assert len(served_ids) == 8
    # each served token is transformers' argmax, up to a near tie of two float32 kernels (random weights give
    # flat distributions: a 1e-4 gap is a tie, a different model would miss by whole logits)
    gaps = (logits.max(-1).values - logits[torch.arange(8), served_ids]).tolist()
    assert max(gaps) < 1e-3, (name, served_ids, gaps)


def test_a_rope_scaling_that_depends_on_the_length_is_refused_by_name(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from coinfer.quantize.export import ExportError, export_dir
    from tests.families import COMMON

    cfg = LlamaConfig(**COMMON, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    LlamaForCausalLM(cfg).save_pretrained(str(tmp_path / "hf"))
    with pytest.raises(ExportError, match=r"config.json: rope_type 'dynamic' unsupported"):
        export_dir(tmp_path / "hf", tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_external_data_through_export_int8_and_the_edge(tmp_path):
    """A model over 2 GB cannot be one protobuf file: its weights go to model.onnx.data (forced here on a
    small model), and every INT8 scheme reads and writes that layout, so the edge runs it."""
    from coinfer.chat import ChatMessage
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.sampling import Sampling
    from coinfer.quantize.artifact import has_external_data
    from coinfer.quantize.cli import main

    build("qwen2", tmp_path / "hf")
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "onnx"), "--external-data", "always", "--quiet"]) == 0
    assert (tmp_path / "onnx" / "model.onnx.data").stat().st_size > 10 * (
        tmp_path / "onnx" / "model.onnx"
    ).stat().st_size
    for scheme in SCHEMES:
        out = tmp_path / scheme
        assert (
            main(
                [
                    "int8",
                    str(tmp_path / "onnx"),
                    str(out),
                    "--scheme",
                    scheme,
                    "--quiet",
                    "--no-gates",
                    "--calib-prompts",
                    "4",
                ]
            )
            == 0
        ), scheme
        assert has_external_data(out / "model.onnx") and sorted(p.name for p in out.iterdir() if "onnx" in p.name) == [
            "model.onnx",
            "model.onnx.data",
        ], scheme
        manifest = json.loads((out / "manifest.json").read_text())
        assert "model.onnx.data" in manifest["files"] and manifest["checks"]["passed"]
        engine = OrtDraftEngine(out)  # the manifest covers the weights file too
        drafts = engine.generate(engine.render([ChatMessage("user", "Hi")]), Sampling(n=2, max_new_tokens=4, seed=1))
        assert len(drafts) == 2


@pytest.mark.parametrize("name", list(FAMILIES))
def test_kv_buffer_export_writes_the_cache_in_place(name, tmp_path):
    """``--kv-cache buffer``: GroupQueryAttention over preallocated buffers bound as input and output, in
    ONNX Runtime's fused graph (one MatMul for q/k/v and one for gate/up; rotary and residual + RMSNorm
    as single nodes where the family allows). Parity with torch on that path (past the sliding
    windows), INT8 keeps it, and the edge's drafts equal the concatenating export's."""
    import numpy as np
    import onnx
    from transformers import AutoTokenizer

    from coinfer.chat import ChatFormat, ChatMessage
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.onnx_lm import Buffers
    from coinfer.edge.sampling import Sampling
    from coinfer.quantize.build import BuildOptions, int8_dir
    from coinfer.quantize.check import check_structure
    from coinfer.quantize.export import export_dir
    from coinfer.quantize.int8 import QuantConfig

    hf = build(name, tmp_path / "hf")
    text = ChatFormat.from_dir(hf).render([ChatMessage("user", LONG_TURN)])
    ids = AutoTokenizer.from_pretrained(str(hf))(text, add_special_tokens=False)["input_ids"]
    report = export_dir(hf, tmp_path / "buffer", parity_prompt=ids, parity_steps=16, kv_cache="buffer")
    assert report["parity"]["greedy_match"] and report["parity"]["max_logit_diff"] < 1e-3, report["parity"]
    graph = onnx.load(str(tmp_path / "buffer" / "model.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    layers = json.loads((hf / "config.json").read_text())["num_hidden_layers"]
    assert ops.count("GroupQueryAttention") == layers
    assert ops.count("RotaryEmbedding") == 2 * layers  # query and key (after Qwen3's, Gemma 3's per-head norms)
    # the residual sums with the norm after them (Gemma's (1 + w) folded): each layer's two, but the first
    # layer's input norm (no sum before it), and the final norm's
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 * layers

    engine = OrtDraftEngine(tmp_path / "buffer")
    assert engine.lm.kv_buffer
    past = engine.lm.empty_past(len(ids) + 4)
    ptrs = [v.data_ptr() for v in past]
    logits, past = engine.lm.step(np.array([ids], np.int64), past)
    logits, past = engine.lm.step(logits.argmax(-1)[:, None].astype(np.int64), past)
    assert isinstance(past, Buffers) and past.length == len(ids) + 1
    assert [v.data_ptr() for v in past] == ptrs  # written in place: the same memory every step
    assert np.abs(past[0].numpy()[0, :, len(ids)]).sum() > 0 and not past[0].numpy()[0, :, len(ids) + 1 :].any()

    export_dir(hf, tmp_path / "concat")
    concat = OrtDraftEngine(tmp_path / "concat")
    prompt = engine.render([ChatMessage("user", "Write a haiku about rain.")])
    s = Sampling(n=3, temperature=0.0, max_new_tokens=12, presence_penalty=0.0, frequency_penalty=0.0)
    assert [d.token_ids for d in engine.generate(prompt, s)] == [d.token_ids for d in concat.generate(prompt, s)]

    int8_dir(
        tmp_path / "buffer", tmp_path / "int8", QuantConfig(scheme="dynamic"), BuildOptions(gates=None, progress=False)
    )
    checked, problems = check_structure(tmp_path / "int8" / "model.onnx")
    assert problems == [] and checked == _linear_count(hf, fused=True)
    q = OrtDraftEngine(tmp_path / "int8")
    assert q.lm.kv_buffer and len(q.generate(prompt, Sampling(n=5, max_new_tokens=8, seed=3))) == 5


@pytest.mark.parametrize("kv_cache", ["concat", "buffer"])
def test_gemma3_soft_capping_when_the_config_sets_it(kv_cache):
    """Gemma 3 configs usually leave attention and final-logit soft-capping unset (the family above); where one
    sets them, the export graph caps as transformers does: the final logits (its attention ignores the field,
    as vLLM's and llama.cpp's do). The graph's module in torch (the buffer graph's contrib ops by their
    reference implementations) on the KV path, 20 steps past the window of 8."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from coinfer.quantize.decoder_graph import ExportDecoder
    from tests.families import TINY_GEMMA3, VOCAB

    cfg = Gemma3TextConfig(
        **TINY_GEMMA3,
        vocab_size=VOCAB,
        head_dim=32,
        sliding_window=8,
        attn_logit_softcapping=2.0,  # low caps: they bind on random weights
        final_logit_softcapping=1.0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    hf = Gemma3ForCausalLM(cfg).eval()
    ids = torch.randint(4, VOCAB, (1, 32))
    graph = ExportDecoder(hf, kv_cache=kv_cache).eval()
    past = [torch.zeros(1, 1, 0, 32) for _ in range(2 * graph.num_layers)]
    got = []
    with torch.no_grad():
        ref = hf(ids).logits[0, 11:]
        for start, end in [(0, 12), *((t, t + 1) for t in range(12, 32))]:
            out = graph(ids[:, start:end], torch.ones(1, end, dtype=torch.long), torch.arange(start, end)[None], *past)
            got, past = got + [out[0][0, -1]], out[1:]
    assert ref.abs().max() <= 1.0 and float((torch.stack(got) - ref).abs().max()) < 1e-5
