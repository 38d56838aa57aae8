"""INT8 dynamic quantization of the demo draft, the structure check, and the CLI."""

import json
import random

import pytest

from coinfer.tasks import TASKS
from demo.train import problems
from edge.draft_engine import OrtDraftEngine
from edge.sampling import Sampling
from quantize.check import check_structure
from quantize.cli import main
from quantize.int8 import quantize_dir

pytestmark = pytest.mark.slow
GREEDY = Sampling(n=1, temperature=0.0, presence_penalty=0.0, frequency_penalty=0.0)


@pytest.fixture(scope="module")
def int8_dir(artifacts, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "int8"
    assert main(["int8", str(artifacts.draft_onnx), str(out), "--json"]) == 0
    return out


def test_dynamic_int8_is_per_channel_and_smaller(int8_dir, artifacts):
    checked, problems_ = check_structure(int8_dir / "model.onnx")
    layers = artifacts.models.report["recipe"]["draft"]["layers"]
    assert checked == 7 * layers + 1 and problems_ == []  # q k v o gate up down per layer + LM head
    size, fp32 = (int8_dir / "model.onnx").stat().st_size, (artifacts.draft_onnx / "model.onnx").stat().st_size
    assert size <= 0.4 * fp32


def test_per_tensor_model_is_caught(artifacts, tmp_path):
    quantize_dir(artifacts.draft_onnx, tmp_path / "pt", per_channel=False)
    checked, problems_ = check_structure(tmp_path / "pt" / "model.onnx")
    assert checked > 0 and problems_ and "expected [" in problems_[0]
    assert main(["check", str(tmp_path / "pt")]) == 1
    assert main(["check", str(artifacts.draft_onnx)]) == 1  # FP32: nothing quantized


def test_int8_drafts_track_fp32(int8_dir, artifacts):
    fp32, int8 = OrtDraftEngine(artifacts.draft_onnx), OrtDraftEngine(int8_dir)
    stream = problems(random.Random(5), ("arith", "select"), held_out=True)
    same = acc32 = acc8 = 0
    n = 30
    for _ in range(n):
        p = next(stream)
        task = TASKS[p.task]
        a = fp32.generate(task.format_prompt(p.prompt), GREEDY)[0].text
        b = int8.generate(task.format_prompt(p.prompt), GREEDY)[0].text
        same += a == b
        acc32 += task.grade(p.spec, task.parse_answer(a))
        acc8 += task.grade(p.spec, task.parse_answer(b))
    assert same / n >= 0.6, f"greedy drafts identical in {same}/{n}"
    assert acc8 >= acc32 - 3, (acc32, acc8)


def test_cli_bad_input_exits_2_and_leaves_nothing(tmp_path, artifacts, capsys):
    assert main(["int8", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "model.onnx: missing" in capsys.readouterr().err
    (tmp_path / "exists").mkdir()
    assert main(["int8", str(artifacts.draft_onnx), str(tmp_path / "exists")]) == 2
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out2")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]
    assert main(["check", str(artifacts.draft_onnx), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["weights_checked"] == 0
