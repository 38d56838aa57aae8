"""benchmarks.perplexity on the demo draft: a model against itself measures nothing lost; its INT8
model is measured against it on the same tokens."""

import json
import math


def test_a_model_against_itself_loses_nothing_and_int8_is_measured(artifacts, capsys):
    from benchmarks.perplexity import default_text, main

    assert "Python" in default_text() and len(default_text()) > 1000
    assert (
        main(
            [
                str(artifacts.draft_onnx),
                str(artifacts.draft_onnx),
                str(artifacts.draft_int8),
                "--tokens",
                "96",
                "--json",
            ]
        )
        == 0
    )
    ref, same, q = json.loads(capsys.readouterr().out)
    assert ref["tokens"] == same["tokens"] == q["tokens"] == 95
    assert same["top1_agreement"] == 1.0 and same["nll_delta"] == 0.0 and same["kl_divergence"] < 1e-9
    assert math.isclose(same["perplexity"], ref["perplexity"]) and ref["perplexity"] > 1.0
    assert q["kl_divergence"] > 0.0 and math.isclose(q["perplexity_ratio"], math.exp(q["nll_delta"]))
