"""``import``: a GGUF file (llama.cpp's format, how most small models are shared) -> a Hugging Face directory.

Usage::

    python -m coinfer.quantize import SmolLM2-135M-Instruct.Q4_1.gguf smollm2-hf
    python -m coinfer.quantize export smollm2-hf smollm2-onnx          # then int8, and vLLM serves smollm2-hf

transformers' GGUF loader reads the weights (dequantized to float32: a Q4 file does not become a
better model, but every later step -- the ONNX export, calibration, vLLM -- wants float weights) and
the tokenizer with its chat template. The directory written holds safetensors, ``config.json``,
``generation_config.json``, the tokenizer and its chat template, and ``import.json`` (what was read,
from which file, in how long).

End of turn: a chat model stops where its template closes the assistant's turn (``<|im_end|>`` in
ChatML, ``<|eot_id|>`` in Llama 3, ``<end_of_turn>`` in Gemma). GGUF files name that token
inconsistently (``eos_token_id`` is sometimes the end of the whole text, ``eot_token_id`` is often
absent), so it is read off the template itself: the first token it writes after an assistant message.
It becomes the eos of the tokenizer, ``config.json`` (the edge stops on it) and
``generation_config.json`` (vLLM stops on it), ahead of the file's own eos where they differ.

Only the architectures the ONNX export states exactly are imported (``GGUF_ARCHITECTURES``); any other is
refused by name before the weights are read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from coinfer.manifest import sha256_file
from coinfer.quantize.artifact import ArtifactError, staged

log = logging.getLogger(__name__)

GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
}
"""``general.architecture`` values imported -> the transformers class they load as: what transformers'
GGUF loader reads *and* ``coinfer.quantize.export.SUPPORTED`` exports. (llama.cpp writes Mistral models as
``llama``; transformers tells them apart by name and loads them as Mistral, also exported.)"""
IMPORT_FILE = "import.json"
_MARKER = "\u2063coinfer-end-of-turn-probe\u2063"  # text no template alters, to find what follows it


class GgufError(ArtifactError):
    """The GGUF file cannot be imported (missing, unreadable, unsupported architecture); exit status 2."""


def _gguf_reader(path: Path):
    import importlib.util

    # transformers' GGUF loader needs both (accelerate places the dequantized tensors)
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise GgufError(f"{' and '.join(missing)} missing: pip install 'coinfer[gguf]'")
    from gguf import GGUFReader

    if not path.is_file():
        raise GgufError(f"{path}: missing")
    try:
        return GGUFReader(str(path))  # memory-mapped: reads the header and metadata, not the weights
    except Exception as exc:  # gguf raises ValueError / struct.error / IndexError on foreign bytes
        raise GgufError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {str(exc)[:200]})") from None


def gguf_architecture(path: Path) -> str:
    """The file's ``general.architecture`` (e.g. ``llama``)."""
    reader = _gguf_reader(path)
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GgufError(f"{path}: no general.architecture in its metadata")
    return str(field.contents())


def check_architecture(path: Path) -> str:
    """The file's architecture if importable, else GgufError naming it and the supported ones."""
    arch = gguf_architecture(path)
    if arch not in GGUF_ARCHITECTURES:
        raise GgufError(
            f"{path}: GGUF architecture {arch!r} unsupported (supported: "
            f"{', '.join(GGUF_ARCHITECTURES)}; what the ONNX export states exactly)"
        )
    return arch


def end_of_turn(tokenizer) -> str | None:
    """The special token the chat template writes right after an assistant message (None without a
    template, or when the template ends the turn with ordinary text)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _MARKER}],
        tokenize=False,
        add_generation_prompt=False,
    )
    if _MARKER not in text:
        return None
    after = text.split(_MARKER, 1)[1].lstrip(" ")
    specials = sorted(
        tokenizer.all_special_tokens + [str(t) for t in tokenizer.get_added_vocab()], key=len, reverse=True
    )  # the longest first: "<|im_end|>" before a shorter token it starts with
    return next((t for t in specials if t and after.startswith(t)), None)


def code_hash() -> str:
    """What an import's output depends on besides the file: this module and the loader's versions."""
    import gguf
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"transformers {transformers.__version__} gguf {getattr(gguf, '__version__', '?')}".encode())
    return h.hexdigest()


def _dequantized() -> dict:
    """Loader options for plain float weights. transformers >= 5.x keeps GGUF blocks packed in its own
    ``GgufLinear`` layers unless told to unpack them; the export and vLLM want ``nn.Linear``. Older
    versions always unpack (and have no ``GgufConfig``)."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _portable_tokenizer_class(path: Path) -> None:
    """transformers 5 names its fast tokenizer ``TokenizersBackend``, a class 4.x (a vLLM image may pin
    one) cannot find; ``PreTrainedTokenizerFast`` is the same class in 5 and exists in 4."""
    cfg = json.loads(path.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def import_gguf(gguf_file: Path, out_dir: Path) -> dict:
    """Write the HF directory of ``gguf_file`` to ``out_dir`` atomically; returns the report (``import.json``)."""
    gguf_file = Path(gguf_file)
    arch = check_architecture(gguf_file)  # refused before a temp dir exists or any weight is read
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    with staged(out_dir) as tmp:
        t0 = time.perf_counter()
        src = dict(pretrained_model_name_or_path=str(gguf_file.parent), gguf_file=gguf_file.name)
        try:
            model = AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32, **_dequantized())
            tokenizer = AutoTokenizer.from_pretrained(**src)
        except (ValueError, KeyError, OSError, NotImplementedError) as exc:  # a tensor type or tokenizer it lacks
            raise GgufError(
                f"{gguf_file}: transformers cannot load it: {type(exc).__name__}: {str(exc)[:300]}"
            ) from None
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:  # the weights are dense float32 now: drop the GGUF marker that forbids saving
            quantizer.remove_quantization_config(model)
        load_s = time.perf_counter() - t0
        cfg = model.config
        loaded = type(model).__name__  # config.architectures is unset after a GGUF load; save_pretrained writes this
        from coinfer.quantize.export import SUPPORTED

        if loaded not in SUPPORTED:  # e.g. a future loader mapping that the export cannot state
            raise GgufError(
                f"{gguf_file}: loads as {loaded}, which the export does not support (supported: {', '.join(SUPPORTED)})"
            )
        eot = end_of_turn(tokenizer)
        if not tokenizer.chat_template:
            log.warning(
                "%s has no chat template: the edge and vLLM will see plain text (User: / Assistant:)", gguf_file
            )
        file_eos = tokenizer.eos_token
        if eot is not None and eot != file_eos:
            tokenizer.eos_token = eot  # what apply_chat_template's {{ eos_token }} and vLLM's stop use
        stops = [t for t in dict.fromkeys([eot, file_eos]) if t is not None]
        eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in stops]
        eos: int | list[int] | None = eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None)
        cfg.eos_token_id = eos  # the edge reads its stop ids from config.json
        cfg.bos_token_id = tokenizer.bos_token_id  # the file's own (None if it states none, not a class default)
        model.generation_config = GenerationConfig(
            bos_token_id=cfg.bos_token_id, eos_token_id=eos, pad_token_id=getattr(cfg, "pad_token_id", None)
        )
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _portable_tokenizer_class(tmp / "tokenizer_config.json")
        report = {
            "source": {
                "path": str(gguf_file),
                "sha256": sha256_file(gguf_file),
                "bytes": gguf_file.stat().st_size,
                "architecture": arch,
            },
            "architecture": loaded,
            "dtype": "float32",
            "parameters": sum(p.numel() for p in model.parameters()),
            "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
            "chat_template": bool(tokenizer.chat_template),
            "end_of_turn": eot,
            "file_eos": file_eos,
            "eos_token_id": eos,
            "code_sha256": code_hash(),
            "seconds": {"load": round(load_s, 2), "total": round(time.perf_counter() - t0, 2)},
        }
        (tmp / IMPORT_FILE).write_text(json.dumps(report, indent=2))
        log.info("imported %s (%s) in %.1f s", gguf_file, arch, report["seconds"]["total"])
    return report
