"""INT8 quantization of an exported draft model: per-channel MatMul weights, three schemes.

Only MatMuls whose weight (input B) is a constant are quantized: the seven
projections of every layer and the LM head. Attention's activation x activation
MatMuls, embeddings (Gather) and norm weights stay float: quantizing embeddings
per-tensor broke a test model completely, and activation x activation
products gain little from INT8 at draft-model sizes.

``dynamic``      per-channel int8 weights (MatMulInteger), activations quantized at run
                 time: ONNX Runtime's CPU path (VNNI / AVX2 u8s8 kernels).
``static``       QDQ: per-channel int8 weights, uint8 activations with ranges calibrated on
                 real task prompts, prefill and decode steps with real KV caches
                 (``coinfer.quantize.calibrate``). The format TensorRT and QNN-style EPs consume.
``weight-only``  8-bit MatMulNBits: uint8 weights with a scale and zero point per output
                 channel and K-block (the default). Activations: on CPU at accuracy level 4 (the
                 default) quantized to int8 per token and K-block inside the kernel; at level 0
                 and on the CUDA EP they stay float (the manifest records which).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from coinfer.quantize.artifact import data_file, has_external_data, save_model

log = logging.getLogger(__name__)
SCHEMES = ("dynamic", "static", "weight-only")
# where each scheme is meant to run (recorded in the manifest; `check --providers` verifies)
PROVIDERS = {
    "dynamic": ["CPUExecutionProvider"],
    "static": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    "weight-only": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize. Defaults run on CPU in seconds for the demo draft."""

    scheme: str = "weight-only"
    """The default keeps a real model's answers (SmolLM2-135M-Instruct, 1,829 positions of 32 chat
    prompts: top-1 0.961, NLL +0.002 nats/token, KL 0.006 at block 64), where per-tensor activation
    scales do not (dynamic: top-1 0.85, NLL +0.17; static: 0.50, +1.61): its activations are
    quantized per token and per K-block inside the kernel, so an outlier spoils one block of one row."""
    per_channel: bool = True
    """False builds a deliberately wrong per-tensor model (structure-check tests); the CLI never sets it."""
    calib_prompts: int = 32
    """static: most calibration prompts (drawn from the train side; see ``coinfer.quantize.prompts``)."""
    calib_decode_steps: int = 8
    """static: greedy decode steps recorded per prompt after its prefill."""
    block_size: int = 64
    """weight-only: K-block length (a power of 2 >= 16); 0 = one block spanning K (pure per-channel).
    The block also bounds the int8 activation groups at accuracy level 4. SmolLM2-135M (top-1 / NLL
    delta / b1 speed-up over FP32, one run): 128: 0.944 / 0.014 / 2.28x; 64: 0.961 / 0.002 / 2.24x;
    32: 0.973 / 0.002 / 2.04x."""
    accuracy_level: int = 4
    """weight-only: MatMulNBits compute type on CPU (0 = float, 4 = int8 activations per block: on the
    134M benchmark model 6.7 ms/token vs 252 with float compute); CUDA ignores it."""
    embeddings: str = "fp16"
    """Embedding tables stay float (never int8: per-tensor int8 embeddings broke a test model); "fp16"
    halves their bytes at no speed cost (a Gather reads one row per token) and casts the row to fp32."""
    keep_float: tuple[str, ...] = ()
    """MatMuls left in float, by the module they were exported from: a bare word matches any module
    containing it ("down_proj", "lm_head"), a dotted name matches a whole suffix
    ("layers.11.mlp.down_proj"). For the few whose inputs carry a real model's massive activation
    outliers (``coinfer.quantize.outliers``); "auto" adds those the outlier pass finds. Recorded (resolved)
    in the manifest."""
    reduce_range: str = "auto"
    """dynamic / static: "on" = 7-bit weights, "off" = 8-bit, "auto" = on unless this CPU has VNNI.
    Without VNNI, x86 u8s8 kernels (vpmaddubsw) saturate int16 sums of 8-bit products; measured on
    the demo draft on an AVX2-only CPU: top-1 agreement 97.9% -> 99.6%, greedy match 31% -> 84%."""

    def validate(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: unknown {self.scheme!r} (known: {', '.join(SCHEMES)})")
        if not 1 <= self.calib_prompts <= 4096:
            raise ValueError(f"calib_prompts: must be in 1..4096, got {self.calib_prompts}")
        if not 0 <= self.calib_decode_steps <= 256:
            raise ValueError(f"calib_decode_steps: must be in 0..256, got {self.calib_decode_steps}")
        if self.reduce_range not in ("auto", "on", "off"):
            raise ValueError(f"reduce_range: must be auto|on|off, got {self.reduce_range!r}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"accuracy_level: must be 0..4, got {self.accuracy_level}")
        if self.embeddings not in ("fp32", "fp16"):
            raise ValueError(f"embeddings: must be fp32|fp16, got {self.embeddings!r}")
        if self.scheme == "weight-only" and not self.per_channel:
            raise ValueError("per_channel: weight-only quantization is always per output channel")
        b = self.block_size
        if b != 0 and (b < 16 or b & (b - 1)):
            raise ValueError(f"block_size: must be 0 or a power of 2 >= 16, got {b}")

    def reduced(self) -> bool:
        return self.reduce_range == "on" or (self.reduce_range == "auto" and not cpu_has_vnni())

    def params(self) -> dict:
        """The parameters that matter for this scheme (recorded in the manifest)."""
        d = asdict(self)
        keep = {
            "dynamic": (),
            "static": ("calib_prompts", "calib_decode_steps"),
            "weight-only": ("block_size", "accuracy_level"),
        }
        out = {
            "per_channel": self.per_channel,
            "ops": ["MatMul"],
            "embeddings": self.embeddings,
            **{k: d[k] for k in keep[self.scheme]},
        }
        out["keep_float"] = list(self.keep_float)
        if self.scheme != "weight-only":
            out["reduce_range"] = self.reduced()
        out.update(
            {
                "dynamic": {"weight_type": "int8", "activations": "dynamic uint8"},
                "static": {"weight_type": "int8", "activation_type": "uint8", "format": "QDQ", "calibration": "minmax"},
                "weight-only": {
                    "weight_type": "uint8 (8-bit MatMulNBits)",
                    # accuracy level 4: the CPU kernel quantizes activations to int8 per K-block
                    "activations": "int8 per block (CPU)" if self.accuracy_level == 4 else "float",
                },
            }[self.scheme]
        )
        return out


def cpu_has_vnni() -> bool:
    """x86 VNNI (AVX512-VNNI or AVX-VNNI): int8 dot products without int16 saturation."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def module_of(node: onnx.NodeProto) -> str:
    """The PyTorch module a node was exported from ("model.layers.11.mlp.down_proj"; the exporter's
    ``namespace`` metadata), else its weight's name: what ``keep_float`` matches."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            scopes = [s.strip(" '\"") for s in p.value.strip("[]").split(",")]
            named = [s for s in scopes if "." in s or s.startswith("model")]
            if named:
                return named[-1]
    return node.input[1] if len(node.input) > 1 else node.name


def kept_float(node: onnx.NodeProto, keep_float: tuple[str, ...]) -> bool:
    """``node``'s module (or weight) name matches one of ``keep_float`` (a substring, or a whole
    dotted suffix: "layers.1.mlp.down_proj" does not match layer 11)."""
    name = module_of(node)
    return any(name == k or name.endswith("." + k) or ("." not in k and k in name) for k in keep_float)


def weight_matmuls(model: onnx.ModelProto, keep_float: tuple[str, ...] = ()) -> list[str]:
    """Names of the MatMul nodes whose B input is a constant initializer (the weights), except those
    ``keep_float`` names (``kept_float``)."""
    inits = {i.name for i in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits and not kept_float(n, keep_float)
    ]


def _named(src: Path, dst: Path) -> onnx.ModelProto:
    """The source graph with every node named (the quantizers select nodes by name), saved at ``dst``.

    The weights are not loaded here: a graph whose weights sit in an external file refers to a copy
    of that file beside ``dst`` (onnx refuses symbolic and hard links to weights), so a model over
    2 GB is held in memory once, by the quantizer, at the cost of a temporary copy on disk."""
    model = onnx.load(str(src), load_external_data=False)
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{i}"
    locations = {
        e.value
        for i in model.graph.initializer
        if i.data_location == onnx.TensorProto.EXTERNAL
        for e in i.external_data
        if e.key == "location"
    }
    for loc in locations:
        shutil.copyfile(src.parent / loc, dst.parent / loc)
    onnx.save(model, str(dst))
    return model


def quantize_model(src: Path, dst: Path, cfg: QuantConfig, calibration: Callable[[], object] | None = None) -> dict:
    """Quantize one ONNX file. ``calibration()`` builds the static scheme's data reader."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    cfg.validate()
    scratch = dst.parent / f".named-{dst.stem}"  # its own dir: a linked weights file must not meet dst's
    scratch.mkdir(exist_ok=True)
    named = scratch / dst.name
    model = _named(src, named)
    info: dict = {}
    external = has_external_data(src)
    nodes = weight_matmuls(model, cfg.keep_float)
    info["kept_float"] = len(weight_matmuls(model)) - len(nodes)
    if not nodes:
        shutil.rmtree(scratch)
        raise ValueError(f"{src}: no MatMul with a constant weight: nothing to quantize")
    info.update({"weights": len(nodes), "external_data": external})
    try:
        if cfg.scheme == "dynamic":
            quantize_dynamic(
                str(named),
                str(dst),
                per_channel=cfg.per_channel,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=nodes,
                reduce_range=cfg.reduced(),
                use_external_data_format=external,
            )
        elif cfg.scheme == "static":
            assert calibration is not None, "static quantization needs calibration data"
            reader = calibration()
            quantize_static(
                str(named),
                str(dst),
                reader,
                quant_format=QuantFormat.QDQ,
                per_channel=cfg.per_channel,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=nodes,
                reduce_range=cfg.reduced(),
                calibrate_method=CalibrationMethod.MinMax,
                use_external_data_format=external,
                extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
            )
            info["calibration_feeds"] = getattr(reader, "feeds", None)
        else:
            info["block_size"] = _blockwise(named, dst, cfg, nodes, external)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if cfg.embeddings == "fp16":
        info["fp16_tables"] = fp16_embeddings(dst)
    return info


def _blockwise(named: Path, dst: Path, cfg: QuantConfig, nodes: list[str], external: bool) -> int:
    """The block-wise scheme (ONNX Runtime's MatMulNBits, 8 bits) of ``nodes``; returns the block size used."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(named))  # the weights, once
    inits = {i.name: i for i in model.graph.initializer}
    chosen = set(nodes)
    k_max = max(int(inits[n.input[1]].dims[0]) for n in model.graph.node if n.name in chosen)
    block = cfg.block_size or max(16, 1 << (k_max - 1).bit_length())
    # nodes_to_include only adds to op_types_to_quantize (every MatMul is taken): exclude instead
    skip = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in chosen]
    q = MatMulNBitsQuantizer(
        model,
        bits=8,
        block_size=block,
        is_symmetric=False,
        accuracy_level=cfg.accuracy_level,
        nodes_to_exclude=skip,
        op_types_to_quantize=("MatMul",),
    )
    q.process()
    data_file(dst).unlink(missing_ok=True)
    q.model.save_model_to_file(str(dst), use_external_data_format=external)
    return block


def fp16_embeddings(path: Path) -> list[str]:
    """Store float32 tables read only by Gather as fp16, casting the gathered rows back to fp32."""
    from onnx import TensorProto, helper, numpy_helper

    external = has_external_data(path)
    model = onnx.load(str(path))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for x in n.input:
            users.setdefault(x, []).append(n)
    done = []
    for name, init in inits.items():
        nodes = users.get(name, [])
        if (
            init.data_type != TensorProto.FLOAT
            or not nodes
            or any(n.op_type != "Gather" or n.input[0] != name for n in nodes)
        ):
            continue
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype("float16"), name))
        for n in nodes:
            out = n.output[0]
            n.output[0] = f"{out}_fp16"
            idx = list(g.node).index(n)
            g.node.insert(
                idx + 1, helper.make_node("Cast", [n.output[0]], [out], to=TensorProto.FLOAT, name=f"{n.name}_to_fp32")
            )
        done.append(name)
    if done:
        save_model(model, path, external)
    return done
