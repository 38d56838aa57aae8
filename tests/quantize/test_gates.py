"""The accuracy gates judge a model by stable per-position measures: top-1 agreement, NLL delta and
KL against FP32, teacher-forced on FP32's greedy continuations; whole-continuation greedy match is only
reported. The maths on hand-made logits; then, on a small exported Llama, FP32 against itself passes and an
INT8 model with one layer's weight scale corrupted fails, naming the measures that caught it."""

import json
import math
import shutil

import numpy as np
import pytest

from coinfer.quantize.gates import TASK_FREE, GateConfig, Tally, accuracy_gate, log_softmax


def _gates(tally: Tally, cfg: GateConfig = GateConfig()) -> dict:
    return {r.name: r for r in tally.results(cfg)}


def test_identical_logits_pass_every_gate_with_zero_difference():
    rng = np.random.default_rng(0)
    tally = Tally()
    for _ in range(3):
        logits = [rng.normal(size=50).astype(np.float32) for _ in range(7)]
        tally.add(logits, logits, [int(x.argmax()) for x in logits])
    gates = _gates(tally)
    assert gates["top1_agreement"].value == 1.0 and gates["greedy_match"].value == 1.0
    assert gates["nll_delta"].value == 0.0 and abs(gates["kl_divergence"].value) < 1e-12
    assert all(g.passed for g in gates.values()) and "21/21 positions over 3 prompts" in gates["top1_agreement"].detail


def test_the_measures_are_the_textbook_ones():
    """Two positions over a 3-token vocabulary, worked by hand: the candidate agrees on the first only."""
    p = [np.array([2.0, 0.0, 0.0]), np.array([0.0, 3.0, 0.0])]
    q = [np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 3.0])]
    tally = Tally()
    tally.add(p, q, [0, 1])
    gates = _gates(tally)
    lp, lq = [log_softmax(x) for x in p], [log_softmax(x) for x in q]
    kl = sum(float(np.sum(np.exp(a) * (a - b))) for a, b in zip(lp, lq)) / 2
    nll = (-(lq[0][0] + lq[1][1]) + (lp[0][0] + lp[1][1])) / 2
    assert gates["top1_agreement"].value == 0.5 and gates["greedy_match"].value == 0.0
    assert gates["kl_divergence"].value == pytest.approx(kl) and gates["nll_delta"].value == pytest.approx(nll)
    assert f"perplexity x{math.exp(nll):.3f}" in gates["nll_delta"].detail
    for name in TASK_FREE:  # each failing gate names its measure and the miss
        assert (
            not gates[name].passed and gates[name].message.startswith(f"{name} ") and "FAIL by" in gates[name].message
        )


def test_greedy_match_is_reported_never_failed():
    """One flipped argmax in 64 positions (top-1 0.984) makes the whole greedy continuation differ."""
    rng = np.random.default_rng(1)
    ref = [rng.normal(size=20) * 4 for _ in range(64)]
    cand = [r.copy() for r in ref]
    cand[40][np.argsort(ref[40])[-2]] = ref[40].max() + 1e-3  # the runner-up now wins by a hair
    tally = Tally()
    tally.add(ref, cand, [int(r.argmax()) for r in ref])
    gates = _gates(tally)
    assert gates["greedy_match"].value == 0.0 and gates["greedy_match"].passed
    assert "(reported, not gated)" in gates["greedy_match"].message
    assert gates["top1_agreement"].value == pytest.approx(63 / 64) and all(gates[n].passed for n in TASK_FREE)


def test_without_gradable_prompts_the_accuracy_gate_names_the_gates_that_judge():
    msg = accuracy_gate(0, 0, 0, GateConfig()).message
    assert "not applicable" in msg and all(n in msg for n in TASK_FREE) and "greedy" not in msg


@pytest.mark.parametrize(
    "field, value", [("max_kl_divergence", -0.1), ("max_nll_delta", 11.0), ("min_top1_agreement", 1.5)]
)
def test_bad_thresholds_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        GateConfig(**{field: value}).validate()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """root/onnx (FP32 export of the small random-weight Llama of tests/families.py) and root/dynamic (INT8)."""
    from coinfer.quantize.build import BuildOptions, int8_dir
    from coinfer.quantize.export import export_dir
    from coinfer.quantize.int8 import QuantConfig
    from tests.families import build

    root = tmp_path_factory.mktemp("gates")
    build("llama", root / "hf")
    export_dir(root / "hf", root / "onnx", parity_prompt=[1, 5, 9, 13], parity_steps=4)
    int8_dir(root / "onnx", root / "dynamic", QuantConfig(scheme="dynamic"), BuildOptions(gates=None, progress=False))
    return root


def _weight_of(onnx_dir, module: str) -> str:
    """The weight initializer of the MatMul the exporter traced from ``module`` (its namespace metadata)."""
    import onnx

    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    for n in model.graph.node:
        if n.op_type == "MatMul" and f"/{module}:" in {p.key: p.value for p in n.metadata_props}.get("namespace", ""):
            return n.input[1]
    raise AssertionError(f"no MatMul traced from {module}")


def _check(main, capsys, reference, candidate, *extra) -> tuple[int, dict]:
    rc = main(
        [
            "check",
            str(candidate),
            "--reference",
            str(reference),
            "--prompts",
            "12",
            "--max-new-tokens",
            "32",
            "--json",
            "--quiet",
            *extra,
        ]
    )
    return rc, {g["name"]: g for g in json.loads(capsys.readouterr().out)["gates"]["gates"]}


@pytest.mark.slow
def test_fp32_against_itself_passes(llama, capsys):
    from coinfer.quantize.cli import main

    rc, gates = _check(main, capsys, llama / "onnx", llama / "onnx", "--no-structure")
    assert rc == 0 and all(g["passed"] for g in gates.values())
    assert gates["top1_agreement"]["value"] == 1.0 and gates["greedy_match"]["value"] == 1.0
    assert gates["nll_delta"]["value"] == 0.0 and gates["kl_divergence"]["value"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_a_scale_corrupted_on_one_layer_fails_naming_the_measure(llama, tmp_path, capsys):
    """Layer 1's attention output projection dequantized with its weight scale 4x too large: structurally a
    fine model whose argmaxes all still agree with FP32's on this small model (measured: top-1 384/384,
    greedy match 12/12: the old greedy-match gate passed it), but whose next-token distributions moved
    (NLL delta 0.76, KL 0.53; the intact INT8 model: 0.000 and 0.000)."""
    import onnx
    from onnx import numpy_helper

    from coinfer.quantize.check import check_structure
    from coinfer.quantize.cli import main

    rc, intact = _check(main, capsys, llama / "onnx", llama / "dynamic")
    assert rc == 0, [g["message"] for g in intact.values()]
    broken = tmp_path / "broken"
    shutil.copytree(llama / "dynamic", broken)
    (broken / "manifest.json").unlink()  # edited by hand: no manifest vouches for it
    model = onnx.load(str(broken / "model.onnx"))
    name = _weight_of(llama / "onnx", "model.layers.1.self_attn.o_proj") + "_scale"
    scale = next(i for i in model.graph.initializer if i.name == name)
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 4, name))
    onnx.save(model, str(broken / "model.onnx"))
    assert check_structure(broken / "model.onnx")[1] == []  # only the gates can tell
    rc, gates = _check(main, capsys, llama / "onnx", broken, "--allow-unverified")
    failed = {n for n, g in gates.items() if not g["passed"]}
    assert rc == 1 and {"nll_delta", "kl_divergence"} <= failed, [g["message"] for g in gates.values()]
    for n in failed:
        assert gates[n]["message"].startswith(f"{n} ") and "FAIL by" in gates[n]["message"]
    assert gates["greedy_match"]["passed"]  # reported only
