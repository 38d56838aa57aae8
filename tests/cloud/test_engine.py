"""Pure logic of the vLLM engine wrapper (the engine itself runs in tests/cloud/test_service.py)."""


def test_tiny_temperatures_are_raised_to_vllms_floor_without_its_per_request_warning():
    from cloud.engine import VLLM_MIN_TEMPERATURE, vllm_temperature

    assert vllm_temperature(0.0) == 0.0 and vllm_temperature(0.7) == 0.7
    assert vllm_temperature(1e-45) == vllm_temperature(0.005) == VLLM_MIN_TEMPERATURE
