"""INT8 schemes on the demo draft: structure, gates, manifest, and what the edge does with them."""

import json
import random

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from coinfer.chat import ChatMessage
from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.sampling import Sampling
from coinfer.manifest import ManifestError
from coinfer.quantize.artifact import copy_sidecars
from coinfer.quantize.check import check_structure
from coinfer.quantize.cli import main
from coinfer.quantize.int8 import SCHEMES, QuantConfig, quantize_model
from coinfer.tasks import TASKS, problems

pytestmark = pytest.mark.slow
GREEDY = Sampling(n=1, temperature=0.0, presence_penalty=0.0, frequency_penalty=0.0)


@pytest.fixture(scope="module")
def built(artifacts, tmp_path_factory):
    """scheme -> (output dir, manifest); each built by the CLI with its default gates."""
    root = tmp_path_factory.mktemp("int8")
    out = {}
    for scheme in SCHEMES:
        d = root / scheme
        rc = main(["int8", str(artifacts.draft_onnx), str(d), "--scheme", scheme, "--json", "--quiet"])
        assert rc == 0, f"{scheme}: exit {rc}"
        out[scheme] = (d, json.loads((d / "manifest.json").read_text()))
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_scheme_is_per_channel_smaller_and_passes_its_gates(built, artifacts, scheme):
    d, manifest = built[scheme]
    checked, problems_ = check_structure(d / "model.onnx")
    layers = artifacts.models.report["recipe"]["draft"]["layers"]
    assert checked == 7 * layers + 1 and problems_ == []  # q k v o gate up down per layer + LM head
    fp32 = (artifacts.draft_onnx / "model.onnx").stat().st_size
    assert (d / "model.onnx").stat().st_size <= 0.45 * fp32
    assert manifest["scheme"] == scheme and manifest["checks"]["passed"] is True
    gates = {g["name"]: g for g in manifest["checks"]["gates"]["gates"]}
    assert set(gates) == {"top1_agreement", "nll_delta", "kl_divergence", "greedy_match", "accuracy_drop"}
    assert gates["greedy_match"]["threshold"] is None and gates["kl_divergence"]["passed"]  # greedy match: reported
    assert gates["top1_agreement"]["value"] >= 0.95, gates["top1_agreement"]["message"]
    assert gates["nll_delta"]["value"] <= 0.05, gates["nll_delta"]["message"]  # measured 0.005 (static)
    assert manifest["providers"] and manifest["source"]["sha256"] and manifest["tokenizer_sha256"]
    assert manifest["params"]["embeddings"] == "fp16" and manifest["params"]["fp16_tables"]
    ops = {n.op_type for n in onnx.load(str(d / "model.onnx")).graph.node}
    assert {"dynamic": "MatMulInteger", "static": "DequantizeLinear", "weight-only": "MatMulNBits"}[scheme] in ops or (
        scheme == "dynamic" and "DynamicQuantizeLinear" in ops
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_edge_engine_runs_every_scheme_close_to_fp32(built, artifacts, scheme):
    fp32, q = OrtDraftEngine(artifacts.draft_onnx), OrtDraftEngine(built[scheme][0])
    stream = problems(random.Random(5), ("arith", "select"), held_out=True)
    same = acc32 = acc8 = 0
    n = 20
    for _ in range(n):
        p = next(stream)
        task = TASKS[p.task]
        prompt = fp32.render([ChatMessage("user", p.prompt)])
        a = fp32.generate(prompt, GREEDY)[0].text
        b = q.generate(prompt, GREEDY)[0].text
        same += a == b
        acc32 += task.grade(p.spec, task.parse_answer(a))
        acc8 += task.grade(p.spec, task.parse_answer(b))
    # whole greedy drafts identical is chaotic (one flipped token changes the rest; 9/20 seen on a
    # VNNI CPU): the portable checks are accuracy (below) and the gates' top-1 / NLL delta
    assert same / n >= 0.25, f"greedy drafts identical in {same}/{n}"
    assert acc8 >= acc32 - 3, (acc32, acc8)


def _build_raw(artifacts, out, cfg: QuantConfig):
    """A quantized dir without gates or manifest (for deliberately wrong models)."""
    out.mkdir()
    copy_sidecars(artifacts.draft_onnx, out)
    reader = None
    if cfg.scheme == "static":
        from tokenizers import Tokenizer

        from coinfer.quantize.calibrate import KvCalibrationReader
        from coinfer.quantize.prompts import task_prompts

        tok = Tokenizer.from_file(str(artifacts.draft_onnx / "tokenizer.json"))
        reader = lambda: KvCalibrationReader(  # noqa: E731
            artifacts.draft_onnx / "model.onnx",
            tok,
            task_prompts(4, held_out=False),
            decode_steps=2,
        )
    quantize_model(artifacts.draft_onnx / "model.onnx", out / "model.onnx", cfg, calibration=reader)
    return out


@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_structure_check_catches_per_tensor_models(artifacts, tmp_path, capsys, scheme):
    d = _build_raw(artifacts, tmp_path / "pt", QuantConfig(scheme=scheme, per_channel=False))
    checked, problems_ = check_structure(d / "model.onnx")
    assert checked > 0 and problems_ and "expected [" in problems_[0]
    assert main(["check", str(d)]) == 1
    assert "per-channel on the output axis" in capsys.readouterr().out
    assert main(["check", str(artifacts.draft_onnx)]) == 1  # FP32: nothing quantized


def test_gates_fail_a_broken_model_and_say_which_by_how_much(artifacts, tmp_path, capsys):
    d = _build_raw(artifacts, tmp_path / "broken", QuantConfig(scheme="dynamic"))
    model = onnx.load(str(d / "model.onnx"))
    for init in model.graph.initializer:  # a mis-scaled export: every weight scale 4x too large
        if init.name.endswith("_scale") and len(init.dims) == 1:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 4, init.name))
    onnx.save(model, str(d / "model.onnx"))
    assert check_structure(d / "model.onnx")[1] == []  # structurally fine: only the gates can tell
    rc = main(
        ["check", str(d), "--reference", str(artifacts.draft_onnx), "--allow-unverified", "--quiet", "--prompts", "12"]
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert "top1_agreement" in out and "FAIL by" in out


def test_failed_gate_publishes_nothing_unless_kept_and_the_edge_refuses_it(artifacts, tmp_path, capsys):
    out = tmp_path / "strict"
    args = [
        "int8",
        str(artifacts.draft_onnx),
        str(out),
        "--min-top1-agreement",
        "1.0",
        "--max-kl-divergence",
        "0.0",
        "--prompts",
        "16",
        "--quiet",
    ]
    assert main(args) == 1
    assert "NOT published" in capsys.readouterr().out and not out.exists()
    assert list(tmp_path.iterdir()) == []
    assert main([*args, "--keep-failed"]) == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checks"]["passed"] is False
    with pytest.raises(ManifestError, match="failed its build checks"):
        OrtDraftEngine(out)
    OrtDraftEngine(out, allow_unverified=True)  # explicitly allowed: loads


def test_static_calibration_file(artifacts, tmp_path, capsys):
    good = tmp_path / "calib.jsonl"
    good.write_text('{"task": "arith", "prompt": "If x=3 and y=4, compute x*y."}\n\n{"prompt": "free text"}\n')
    assert (
        main(
            [
                "int8",
                str(artifacts.draft_onnx),
                str(tmp_path / "s"),
                "--scheme",
                "static",
                "--calibration",
                str(good),
                "--no-gates",
                "--quiet",
            ]
        )
        == 0
    )
    assert check_structure(tmp_path / "s" / "model.onnx")[1] == []
    for body, msg in [
        ('{"prompt": "ok"}\nnot json\n', "calib.jsonl:2: not JSON"),
        ('{"task": "poetry", "prompt": "x"}\n', "task: unknown 'poetry'"),
        ('{"text": "x"}\n', 'non-empty string "prompt"'),
        ("", "no prompts"),
    ]:
        good.write_text(body)
        assert (
            main(
                [
                    "int8",
                    str(artifacts.draft_onnx),
                    str(tmp_path / "bad"),
                    "--scheme",
                    "static",
                    "--calibration",
                    str(good),
                    "--quiet",
                ]
            )
            == 2
        )
        assert msg in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    good.write_bytes(b'{"prompt": "\xff"}\n')
    assert (
        main(
            ["int8", str(artifacts.draft_onnx), str(tmp_path / "bad"), "--scheme", "static", "--calibration", str(good)]
        )
        == 2
    )
    assert "not UTF-8" in capsys.readouterr().err


def test_placement_flags_a_missing_accelerator(built, capsys):
    d = built["dynamic"][0]
    assert main(["check", str(d), "--no-structure", "--providers", "CPUExecutionProvider", "--json"]) == 0
    pl = json.loads(capsys.readouterr().out)["placement"]
    assert pl["session"] == ["CPUExecutionProvider"] and pl["nodes"]["CPUExecutionProvider"] > 0
    assert any(op.startswith("MatMulInteger") for op in pl["by_op"]["CPUExecutionProvider"])
    assert main(["check", str(d), "--no-structure", "--providers", "CUDAExecutionProvider"]) == 1
    assert "CUDAExecutionProvider requested but" in capsys.readouterr().out
    assert main(["check", str(d), "--providers", "NopeExecutionProvider"]) == 2


def test_bench_reports_every_model_side_by_side(built, artifacts, capsys):
    dirs = [str(artifacts.draft_onnx), str(built["dynamic"][0]), str(built["weight-only"][0])]
    assert main(["bench", *dirs, "--batch", "3", "--prompt-tokens", "8", "--decode-steps", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["read_bandwidth_gbs"] > 0 and len(res["rows"]) == 3
    first = res["rows"][0]
    assert first["speedup_b1"] == 1.0 and first["scheme"] == "fp32"
    for r in res["rows"]:
        assert r["decode_ms_b1"] > 0 and r["decode_ms_step_b3"] > 0 and r["peak_rss_mb"] > 10
        assert 0 < r["floor_ms"] and r["read_per_token_bytes"] < r["initializer_bytes"]
    assert res["rows"][1]["size_ratio"] < 0.5
    assert main(["bench", dirs[0], "--batch", "0"]) == 2
    assert main(["bench", dirs[0], "--rounds", "0"]) == 2


def test_bench_rounds_report_each_models_median():
    """Rounds measured in turn: each time is the median over the model's rounds (a drift of the
    machine's speed falls on every model alike), the peak RSS the largest seen."""
    from coinfer.quantize.bench import _median_row

    runs = [
        {"model": "m", "read_ms": r, "decode_ms_b1": b1, "decode_ms_step_b5": b5, "peak_rss_mb": rss, "batch": 5}
        for r, b1, b5, rss in [(9.0, 30.0, 40.0, 100.0), (1.0, 10.0, 12.0, 300.0), (2.0, 11.0, 13.0, 200.0)]
    ]
    row = _median_row(runs)
    assert (row["read_ms"], row["decode_ms_b1"], row["decode_ms_step_b5"]) == (2.0, 11.0, 13.0)
    assert row["peak_rss_mb"] == 300.0 and row["rounds"] == 3 and row["batch"] == 5 and row["model"] == "m"


def test_cli_bad_input_exits_2_and_leaves_nothing(tmp_path, artifacts, capsys):
    assert main(["int8", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "model.onnx: missing" in capsys.readouterr().err
    (tmp_path / "exists").mkdir()
    assert main(["int8", str(artifacts.draft_onnx), str(tmp_path / "exists")]) == 2
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out2")]) == 2
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    assert main(["int8", str(corrupt), str(tmp_path / "out3")]) == 2
    assert "not a valid ONNX model" in capsys.readouterr().err
    assert main(["check", str(corrupt)]) == 2
    assert (
        main(
            [
                "int8",
                str(artifacts.draft_onnx),
                str(tmp_path / "out4"),
                "--block-size",
                "100",
                "--scheme",
                "weight-only",
            ]
        )
        == 2
    )
    assert "block_size" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt", "exists"]
    assert main(["check", str(artifacts.draft_onnx), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["structure"]["weights_checked"] == 0


def test_fp16_embeddings_only_touch_tables_read_by_gather_alone(tmp_path):
    from onnx import TensorProto, helper

    from coinfer.quantize.int8 import fp16_embeddings

    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    shared = numpy_helper.from_array(np.ones((4, 3), np.float32), "shared")  # tied: also a MatMul weight
    g = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="g1"),
            helper.make_node("Gather", ["shared", "ids"], ["f"], name="g2"),
            helper.make_node("MatMul", ["x", "shared"], ["y"], name="mm"),
        ],
        "t",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("e", "f", "y")],
        [table, shared],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), str(path))
    assert fp16_embeddings(path) == ["table"]
    import onnxruntime as ort

    out = ort.InferenceSession(str(path)).run(["e"], {"ids": np.array([1, 3]), "x": np.ones((1, 4), np.float32)})[0]
    assert out.dtype == np.float32 and out.tolist() == [[3, 4, 5], [9, 10, 11]]


def test_gates_on_the_users_own_prompts(artifacts, int8_draft, tmp_path, capsys):
    """--prompts-file: the user's chat requests drive the gates; free prompts are not graded, so the
    accuracy gate says it cannot judge instead of passing silently."""
    f = tmp_path / "mine.jsonl"
    f.write_text(
        "".join(
            json.dumps({"prompt": q}) + "\n"
            for q in (
                "Explain why the sky is blue.",
                "Tom has 3 apples and buys 4 more. How many apples does he have?",
                "Write a haiku about the sea.",
            )
        )
    )
    rc = main(
        [
            "check",
            str(int8_draft),
            "--reference",
            str(artifacts.draft_onnx),
            "--prompts-file",
            str(f),
            "--prompts",
            "3",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    gates = {g["name"]: g for g in report["gates"]["gates"]}
    assert "3 prompts" in gates["top1_agreement"]["detail"]
    assert gates["accuracy_drop"]["value"] is None and "not applicable" in gates["accuracy_drop"]["message"]
    assert rc == (0 if report["gates"]["passed"] else 1)


def test_keep_float_leaves_the_named_matmuls_float_and_auto_keeps_none_of_the_demo_draft(artifacts, tmp_path):
    """A named module stays float (recorded, and the structure check accepts exactly it); the
    outlier pass finds no massive-activation input in the demo draft, so ``auto`` quantizes all."""
    named = tmp_path / "named"
    assert (
        main(
            [
                "int8",
                str(artifacts.draft_onnx),
                str(named),
                "--keep-float",
                "layers.0.mlp.down_proj",
                "--no-gates",
                "--quiet",
            ]
        )
        == 0
    )
    manifest = json.loads((named / "manifest.json").read_text())
    assert manifest["params"]["keep_float"] == ["layers.0.mlp.down_proj"] and manifest["params"]["kept_float"] == 1
    graph = onnx.load(str(named / "model.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "MatMulNBits" for n in graph.node) == manifest["params"]["weights"]
    assert check_structure(named / "model.onnx") == (manifest["params"]["weights"], [])  # the manifest's list
    assert check_structure(named / "model.onnx", ())[1]  # without it: the float MatMul is a problem

    auto = tmp_path / "auto"
    assert main(["int8", str(artifacts.draft_onnx), str(auto), "--keep-float", "auto", "--no-gates", "--quiet"]) == 0
    params = json.loads((auto / "manifest.json").read_text())["params"]
    assert params["keep_float"] == [] and params["kept_float"] == 0
    assert all(s["ratio"] < 100 for s in params["outliers"].values()) and len(params["outliers"]) == 6


@pytest.mark.parametrize(
    "name,keep,kept",
    [
        ("model.layers.11.mlp.down_proj", ("layers.11.mlp.down_proj",), True),
        ("model.layers.11.mlp.down_proj", ("layers.1.mlp.down_proj",), False),  # a dotted name is a whole suffix
        ("model.layers.11.mlp.down_proj", ("down_proj",), True),
        ("model.layers.11.mlp.up_proj", ("down_proj",), False),
    ],
)
def test_keep_float_names_match_whole_module_suffixes(name, keep, kept):
    from onnx import helper

    from coinfer.quantize.int8 import kept_float

    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="node_linear_7")
    node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=f"['', '{name}', 'linear_7']")
    assert kept_float(node, keep) is kept


@pytest.mark.parametrize(
    ("source", "scheme", "expected"),
    [
        (None, "weight-only", ["CUDAExecutionProvider", "CPUExecutionProvider"]),  # an Optimum export: no manifest
        (
            ["CPUExecutionProvider", "CUDAExecutionProvider"],
            "weight-only",
            ["CUDAExecutionProvider", "CPUExecutionProvider"],
        ),
        (["CPUExecutionProvider"], "weight-only", ["CPUExecutionProvider"]),  # from a float32 buffer graph
        (["CPUExecutionProvider", "CUDAExecutionProvider"], "dynamic", ["CPUExecutionProvider"]),
    ],
)
def test_an_int8_artefact_runs_where_its_scheme_and_its_source_both_run(tmp_path, source, scheme, expected):
    from coinfer.quantize.build import runs_on
    from coinfer.quantize.export import providers

    if source is not None:
        (tmp_path / "manifest.json").write_text(json.dumps({"providers": source}))
    assert runs_on(scheme, tmp_path) == expected
    # GroupQueryAttention's CUDA kernel is float16 / bfloat16 only: a float32 buffer graph is a CPU graph
    assert providers("fp32", "buffer") == ["CPUExecutionProvider"]
    assert "CUDAExecutionProvider" in providers("fp16", "buffer") and "CUDAExecutionProvider" in providers(
        "fp32", "concat"
    )
