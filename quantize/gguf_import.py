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

Only the architectures listed in ``GGUF_ARCHITECTURES`` are imported (what the ONNX export states, and
Gemma 3, which vLLM serves); any other is refused by name before the weights are read.

Tensor types: whatever the ``gguf`` package dequantizes (F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, the K-quants
Q2_K..Q6_K, ...): transformers' loader calls ``gguf.quants.dequantize`` on each tensor. Nothing here decodes
blocks by hand.

Gemma 3 (``gemma3``): transformers' loader maps its metadata names and tensors, subtracts the 1 that
llama.cpp's converter adds to every RMSNorm weight (``convert_hf_to_gguf.py``: Gemma3RMSNorm computes
``x * (1 + w)``; the GGUF stores ``1 + w``, transformers wants ``w``), and converts its SentencePiece
vocabulary into a byte-fallback BPE ``tokenizer.json``. What llama.cpp does not write into the file but
hard-codes (``llama-model.cpp``: a 5:1 local / global pattern, the local layers' rotary base 10000, the
attention scale, global rope scaling from the generic ``rope.scaling.*`` keys, optional soft-capping) is
stated here in ``config.json`` (``gemma3_config``), so the directory does not depend on a loader's defaults.

Chat template: the file's own, or ``chat_template=`` (``--chat-template FILE``) for a model that has none or
should read conversations another way, as vLLM takes one. It is saved with the tokenizer
(``chat_template.jinja``), which both the edge (``coinfer.chat.ChatFormat``) and vLLM read. A model with no
template serves plain prompts only: a request in chat form is refused (``coinfer.chat.NoChatTemplate``).

BOS / EOS: the file's ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` decide whether plain text is
tokenized with them (Gemma's base model needs its ``<bos>``; transformers' converter leaves it out).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import struct
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
    "gemma3": "Gemma3ForCausalLM",
}
"""``general.architecture`` values imported -> the transformers class they load as: what transformers'
GGUF loader reads *and* vLLM serves; all but Gemma 3 are also exported (``coinfer.quantize.export.SUPPORTED``),
Gemma 3 once the export states it. (llama.cpp writes Mistral models as ``llama``; transformers tells them
apart by name and loads them as Mistral, also exported.)"""
IMPORT_FILE = "import.json"
_MARKER = "\u2063coinfer-end-of-turn-probe\u2063"  # text no template alters, to find what follows it


class GgufError(ArtifactError):
    """The GGUF file cannot be imported (missing, unreadable, unsupported architecture); exit status 2."""


def _require_loader() -> None:
    import importlib.util

    # transformers' GGUF loader needs both (accelerate places the dequantized tensors)
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise GgufError(f"{' and '.join(missing)} missing: pip install 'coinfer[gguf]'")


# GGUF metadata value types (gguf.GGUFValueType) -> struct format; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_LONG_ARRAY = 1024
"""Arrays longer than this (a vocabulary: tokens, scores, merges) are skipped, their length kept."""


def gguf_metadata(path: Path, tensors: bool = False) -> dict:
    """The file's metadata key / values, read from its header alone: scalars and strings as values, short
    arrays as lists, long ones (the vocabulary) as ``("array", length)``.

    Hand-written rather than ``gguf.GGUFReader``: the reader builds a numpy view of every element of every
    array, 40 s for Gemma 3's 262,144-token vocabulary (8 s for SmolLM2's) before a refusal could be said;
    this walks the header with ``struct`` in well under a second. The format: magic ``GGUF``, version,
    tensor count, key / value count, then each key as a length-prefixed string, its type, its value, then
    each tensor's name, dimensions, type and offset (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
    ``tensors``: also ``"tensors": {name: (ggml type name, shape, byte offset of its data in the file)}``."""
    if not path.is_file():
        raise GgufError(f"{path}: missing")
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _read_header(m, tensors)
    except (ValueError, struct.error, IndexError, OverflowError, UnicodeDecodeError) as exc:
        raise GgufError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {str(exc)[:200]})") from None


class _Reader:
    """GGUF's header values from ``pos`` on in the mapped file ``m`` (byte ``order``: "<" or ">")."""

    def __init__(self, m, order: str, pos: int) -> None:
        self.m, self.order, self.pos = m, order, pos

    def scalar(self, fmt: str):
        (v,) = struct.unpack_from(self.order + fmt, self.m, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.scalar("Q")
        if self.pos + n > len(self.m):
            raise ValueError("string past the end of the file")
        self.pos += n
        return bytes(self.m[self.pos - n : self.pos]).decode("utf-8")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype != 9:
            raise ValueError(f"unknown value type {vtype}")
        etype, n = self.scalar("I"), self.scalar("Q")
        if n <= _LONG_ARRAY:
            return [self.value(etype) for _ in range(n)]
        if etype in _SCALARS:  # fixed-size elements: jump over them
            self.pos += n * struct.calcsize(_SCALARS[etype])
        else:
            for _ in range(n):
                self.value(etype)
        if self.pos > len(self.m):
            raise ValueError("array past the end of the file")
        return ("array", n)

    def tensors(self, n_tensors: int, align: int) -> dict:
        """Each tensor's GGML type, shape (numpy order) and where its data begins in the file."""
        from gguf import GGMLQuantizationType

        infos = {}
        for _ in range(n_tensors):
            name = self.string()
            dims = [self.scalar("Q") for _ in range(self.scalar("I"))]
            kind, offset = self.scalar("I"), self.scalar("Q")
            infos[name] = (GGMLQuantizationType(kind).name, tuple(reversed(dims)), offset)
        start = -(-self.pos // align) * align  # the data section: after the header, aligned
        return {n: (k, shape, start + off) for n, (k, shape, off) in infos.items()}


def _read_header(m, tensors: bool) -> dict:
    if m[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    order = "<"
    (version,) = struct.unpack_from("<I", m, 4)
    if version & 0xFFFF == 0:  # written big-endian (s390x): the version reads byte-swapped
        order = ">"
        (version,) = struct.unpack_from(">I", m, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (read: 2, 3)")
    n_tensors, n_kv = struct.unpack_from(order + "QQ", m, 8)
    r = _Reader(m, order, 24)
    meta: dict = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.scalar("I"))
    if tensors:
        meta["tensors"] = r.tensors(n_tensors, int(meta.get("general.alignment", 32)))
    return meta


def gguf_architecture(path: Path) -> str:
    """The file's ``general.architecture`` (e.g. ``llama``)."""
    arch = gguf_metadata(path).get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{path}: no general.architecture in its metadata")
    return arch


def check_architecture(path: Path) -> str:
    """The file's architecture if importable, else GgufError naming it and the supported ones."""
    arch = gguf_architecture(path)
    if arch not in GGUF_ARCHITECTURES:
        raise GgufError(
            f"{path}: GGUF architecture {arch!r} unsupported (supported: "
            f"{', '.join(GGUF_ARCHITECTURES)}; what the ONNX export states exactly, and Gemma 3)"
        )
    return arch


GEMMA3_SWA_PATTERN = 6
"""llama.cpp (``llama-model.cpp``, LLM_ARCH_GEMMA3): ``set_swa_pattern(6)``, five local layers then one global."""
GEMMA3_LOCAL_ROPE_BASE = 10_000.0
"""llama.cpp: ``rope_freq_base_train_swa = 10000``; not in the file."""


def gemma3_config(meta: dict) -> dict:
    """The ``Gemma3TextConfig`` fields a ``gemma3`` GGUF implies but transformers' loader leaves to its class
    defaults (right for the 270M / 1B models, wrong for others), read the way llama.cpp runs the file:

    - ``layer_types``: ``{arch}.attention.sliding_window_pattern`` where written (a period, or one bool per
      layer, True = local), else llama.cpp's fixed 5:1 pattern; every layer global without a sliding window;
    - ``rope_parameters``: the file's ``rope.freq_base`` and ``rope.scaling.*`` (linear, factor 8 on Gemma 3
      4B+) for the global layers, base 10000 unscaled for the local ones;
    - ``query_pre_attn_scalar``: ``head_dim``, except the 27B (62 layers): hidden / heads (llama.cpp's
      ``f_attention_scale``, after gemma_pytorch's config);
    - ``final_logit_softcapping`` / ``attn_logit_softcapping``: the file's, else none (Gemma 3 has none)."""
    a = "gemma3"
    n_layers = int(meta[f"{a}.block_count"])
    hidden, heads = int(meta[f"{a}.embedding_length"]), int(meta[f"{a}.attention.head_count"])
    head_dim = int(meta.get(f"{a}.attention.key_length", hidden // heads))
    window = meta.get(f"{a}.attention.sliding_window")
    pattern = meta.get(f"{a}.attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
    if isinstance(pattern, list):
        local = [bool(pattern[i % len(pattern)]) for i in range(n_layers)]
    else:
        local = [(i + 1) % int(pattern) != 0 for i in range(n_layers)] if int(pattern) > 1 else [False] * n_layers
    if not window:
        local = [False] * n_layers
    layer_types = ["sliding_attention" if x else "full_attention" for x in local]
    full: dict = {"rope_type": "default", "rope_theta": float(meta.get(f"{a}.rope.freq_base", 1_000_000.0))}
    scaling = meta.get(f"{a}.rope.scaling.type")
    factor = float(meta.get(f"{a}.rope.scaling.factor", 1.0))
    if scaling not in (None, "none") and factor != 1.0:
        if scaling != "linear":
            raise GgufError(f"gemma3: rope scaling {scaling!r} (read: linear)")
        full.update(rope_type="linear", factor=factor)
    cfg = {
        "layer_types": layer_types,
        "sliding_window": int(window) if window else None,
        "head_dim": head_dim,
        "query_pre_attn_scalar": hidden // heads if n_layers == 62 else head_dim,
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_BASE},
        },
        "final_logit_softcapping": meta.get(f"{a}.final_logit_softcapping") or None,
        "attn_logit_softcapping": meta.get(f"{a}.attn_logit_softcapping") or None,
    }
    for k in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg[k] is not None and not math.isfinite(cfg[k]):
            raise GgufError(f"gemma3: {k} {cfg[k]}")
    return cfg


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


def read_chat_template(path: Path) -> str:
    """A chat template file (Jinja, as vLLM's ``--chat-template``), checked to render a conversation."""
    from coinfer.chat import ChatFormat, ChatMessage

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GgufError(f"{path}: cannot read the chat template ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not text.strip():
        raise GgufError(f"{path}: empty chat template")
    try:
        ChatFormat(template=text).render([ChatMessage("system", "s"), ChatMessage("user", "u")])
    except Exception as exc:  # jinja2 syntax or undefined errors: said here, not on the first request
        raise GgufError(f"{path}: not a usable chat template ({type(exc).__name__}: {str(exc)[:200]})") from None
    return text


def _special_tokens_added(tokenizer, meta: dict) -> None:
    """Plain text gets the BOS / EOS the file says it gets (``tokenizer.ggml.add_bos_token``); transformers'
    Gemma converter leaves ``<bos>`` out, and Gemma reads garbage without it. Setting the attribute rebuilds
    the ``tokenizer.json`` post-processor, so the edge's ``tokenizers`` and vLLM add it too."""
    for what in ("bos", "eos"):
        want = meta.get(f"tokenizer.ggml.add_{what}_token")
        if isinstance(want, bool) and getattr(tokenizer, f"{what}_token", None) is not None:
            if bool(getattr(tokenizer, f"add_{what}_token", False)) != want:
                setattr(tokenizer, f"add_{what}_token", want)


def import_gguf(gguf_file: Path, out_dir: Path, chat_template: str | None = None) -> dict:
    """Write the HF directory of ``gguf_file`` to ``out_dir`` atomically; returns the report (``import.json``).
    ``chat_template``: Jinja text that replaces the file's template (or gives one to a model without)."""
    gguf_file = Path(gguf_file)
    _require_loader()
    meta = gguf_metadata(gguf_file)
    arch = check_architecture(gguf_file)  # refused before a temp dir exists or any weight is read
    extra_cfg = gemma3_config(meta) if arch == "gemma3" else {}
    from transformers import GenerationConfig

    with staged(out_dir) as tmp:
        t0 = time.perf_counter()
        model, tokenizer = _load(gguf_file)
        load_s = time.perf_counter() - t0
        cfg = model.config
        # after the load: these fields shape no weight, only how they are used (the in-memory model keeps the
        # loader's values; the directory written states these). Before it, AutoConfig would parse the file's
        # metadata once more (40 s for Gemma 3's vocabulary).
        for k, v in extra_cfg.items():
            setattr(cfg, k, v)
        loaded = _loaded_architecture(gguf_file, model, arch)
        _special_tokens_added(tokenizer, meta)
        file_template = bool(tokenizer.chat_template)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if not tokenizer.chat_template:
            log.warning(
                "%s has no chat template: plain prompts only, requests in chat form are refused "
                "(give it one: quantize import --chat-template FILE)",
                gguf_file,
            )
        file_eos = tokenizer.eos_token
        eot, eos = _end_of_turn_ids(tokenizer)
        cfg.eos_token_id = eos  # the edge reads its stop ids from config.json
        cfg.bos_token_id = tokenizer.bos_token_id  # the file's own (None if it states none, not a class default)
        model.generation_config = GenerationConfig(
            bos_token_id=cfg.bos_token_id, eos_token_id=eos, pad_token_id=getattr(cfg, "pad_token_id", None)
        )
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _portable_tokenizer_class(tmp / "tokenizer_config.json")
        report = {
            "source": _source_report(gguf_file, arch),
            "architecture": loaded,
            "dtype": "float32",
            "parameters": sum(p.numel() for p in model.parameters()),
            "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
            "chat_template": "given" if chat_template is not None else ("file" if file_template else None),
            "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
            "end_of_turn": eot,
            "file_eos": file_eos,
            "eos_token_id": eos,
            "code_sha256": code_hash(),
            "seconds": {"load": round(load_s, 2), "total": round(time.perf_counter() - t0, 2)},
        }
        (tmp / IMPORT_FILE).write_text(json.dumps(report, indent=2))
        log.info("imported %s (%s) in %.1f s", gguf_file, arch, report["seconds"]["total"])
    return report


def _source_report(gguf_file: Path, arch: str) -> dict:
    return {
        "path": str(gguf_file),
        "sha256": sha256_file(gguf_file),
        "bytes": gguf_file.stat().st_size,
        "architecture": arch,
        "tensor_types": tensor_types(gguf_file),
    }


def _load(gguf_file: Path):
    """The file's model (dequantized to float32, saveable) and tokenizer, by transformers' GGUF loader."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = dict(pretrained_model_name_or_path=str(gguf_file.parent), gguf_file=gguf_file.name)
    try:
        model = AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32, **_dequantized())
        tokenizer = AutoTokenizer.from_pretrained(**src)
    except (ValueError, KeyError, OSError, NotImplementedError) as exc:  # a tensor type or tokenizer it lacks
        raise GgufError(f"{gguf_file}: transformers cannot load it: {type(exc).__name__}: {str(exc)[:300]}") from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense float32 now: drop the GGUF marker that forbids saving
        quantizer.remove_quantization_config(model)
    return model, tokenizer


def _loaded_architecture(gguf_file: Path, model, arch: str) -> str:
    """The class the file loaded as (``config.architectures`` is unset after a GGUF load; save_pretrained writes
    this), refused where neither the export nor the import states it."""
    from coinfer.quantize.export import SUPPORTED

    loaded = type(model).__name__
    if loaded not in (*SUPPORTED, GGUF_ARCHITECTURES[arch]):  # e.g. a future loader mapping we do not know
        raise GgufError(
            f"{gguf_file}: loads as {loaded}, which neither the export nor the import states (supported: "
            f"{', '.join(dict.fromkeys([*SUPPORTED, *GGUF_ARCHITECTURES.values()]))})"
        )
    if loaded not in SUPPORTED:
        log.warning("%s loads as %s: vLLM serves it; `quantize export` does not state it yet", gguf_file, loaded)
    return loaded


def _end_of_turn_ids(tokenizer) -> tuple[str | None, int | list[int] | None]:
    """The chat template's end-of-turn token (made the tokenizer's eos: what apply_chat_template's
    ``{{ eos_token }}`` and vLLM's stop use) and the stop ids to state: it and the file's own eos."""
    eot, file_eos = end_of_turn(tokenizer), tokenizer.eos_token
    if eot is not None and eot != file_eos:
        tokenizer.eos_token = eot
    stops = [t for t in dict.fromkeys([eot, file_eos]) if t is not None]
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in stops]
    return eot, eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None)


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds (e.g. ``{"Q4_K": 27, "Q6_K": 9, ...}``)."""
    counts: dict[str, int] = {}
    for kind, _, _ in gguf_metadata(path, tensors=True)["tensors"].values():
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))
