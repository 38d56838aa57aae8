"""The real-model demo's engine settings (the stack itself runs in tests/integration/test_real_model.py)."""

from coinfer.demo.real import engine_config
from coinfer.quantize.real_model import CLOUD_DTYPE


def test_the_real_models_engine_is_float32_and_a_field_given_wins():
    cfg = engine_config("/models/smollm2")
    assert cfg.dtype == CLOUD_DTYPE == "float32" and cfg.max_model_len == 2048 and cfg.url == ""
    # benchmarks.exact_split --engine dtype=bfloat16: refused as a second dtype before
    other = engine_config("/models/smollm2", "http://127.0.0.1:8100", {"dtype": "bfloat16", "max_model_len": 512})
    assert (other.dtype, other.max_model_len, other.url) == ("bfloat16", 512, "http://127.0.0.1:8100")
