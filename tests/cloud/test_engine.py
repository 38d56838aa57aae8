"""Pure logic of the vLLM engine wrapper (the engine itself runs in tests/cloud/test_service.py)."""


def test_tiny_temperatures_are_raised_to_vllms_floor_without_its_per_request_warning():
    from coinfer.cloud.vllm_common import VLLM_MIN_TEMPERATURE, vllm_temperature

    assert vllm_temperature(0.0) == 0.0 and vllm_temperature(0.7) == 0.7
    assert vllm_temperature(1e-45) == vllm_temperature(0.005) == VLLM_MIN_TEMPERATURE


def test_a_hand_serialised_probe_answer_is_the_message_protobuf_would_write():
    from coinfer.cloud.servicer import probe_answer
    from coinfer.v1 import coinfer_pb2 as pb

    for n in (0, 1, 127, 128, 65536, (1 << 20) + 3, 16 << 20):
        msg = pb.ProbeResponse.FromString(probe_answer(n, received=4096))
        assert len(msg.payload) == n and msg.received_bytes == 4096 and msg.server_time_ns > 0
    big = pb.ProbeResponse.FromString(probe_answer(3 << 20, 0)).payload
    assert big[: 1 << 20] == big[1 << 20 : 2 << 20] and len(set(big[:4096])) > 200  # repeated random MiBs


def test_a_streamed_generation_asks_vllm_for_the_configured_tokens_an_output_and_a_whole_answer_for_none():
    from vllm.sampling_params import RequestOutputKind

    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.engine import GenParams
    from coinfer.cloud.vllm_engine import VllmEngine

    engine = VllmEngine(EngineConfig(model="target", stream_interval=4))  # not started: the parameters only
    streamed, whole = (
        engine._params(GenParams(max_tokens=8), 100),
        engine._params(GenParams(max_tokens=8), 100, delta=False),
    )
    assert streamed.stream_interval == 4 and streamed.output_kind == RequestOutputKind.DELTA
    assert whole.stream_interval is None and whole.output_kind == RequestOutputKind.FINAL_ONLY
    assert engine._params(GenParams(max_tokens=8), 100, every=8).stream_interval == 8


def test_auto_dtype_is_float32_only_on_an_x86_cpu_without_bfloat16_instructions(monkeypatch):
    import torch
    from vllm.platforms import current_platform

    from coinfer.cloud.vllm_common import engine_dtype

    def machine(arch: str, bf16: bool, amx: bool, cpu: bool = True):
        monkeypatch.setattr("platform.machine", lambda: arch)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: cpu)

    machine("x86_64", bf16=False, amx=False)
    assert engine_dtype("auto") == "float32"
    assert engine_dtype("bfloat16") == "bfloat16" and engine_dtype("float16") == "float16"  # said is kept
    for arch, bf16, amx, cpu in (
        ("x86_64", True, False, True),
        ("x86_64", False, True, True),
        ("aarch64", False, False, True),
        ("x86_64", False, False, False),
    ):
        machine(arch, bf16, amx, cpu)
        assert engine_dtype("auto") == "auto", (arch, bf16, amx, cpu)  # vLLM's own choice


def test_exact_split_on_a_target_whose_dtype_rounds_near_ties_is_said_with_the_remedy():
    from coinfer.cloud.vllm_common import TIE_NATS, exactness_caveat, tie_nats

    assert exactness_caveat(tie_nats("torch.float32")) is None and exactness_caveat(0.0) is None  # a fake's 0
    said = exactness_caveat(tie_nats("torch.bfloat16"))
    assert said is not None and "bfloat16" in said and "--engine.dtype float32" in said and "0.25 nats" in said
    assert "float16" in exactness_caveat(TIE_NATS["float16"]) and "auto" not in said
    assert "an unknown dtype" in exactness_caveat(0.5)
