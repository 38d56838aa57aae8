"""The GPU estimate's roofline (pure): a decode step memory-bound at small batches and compute-bound at large
ones, the batch sharing a step, prefill priced by FLOPs, and split against the cloud plan from their counts."""

import json

import pytest

from benchmarks.gpu_estimate import GPUS, MODELS, PREFILL_EFFICIENCY, estimate, main, per_answer, prefill_s, step_s

A100, LLAMA = GPUS["a100-80gb"], MODELS["llama-3.1-8b"]


def test_a_decode_step_reads_the_weights_once_at_small_batches_and_is_compute_bound_at_large_ones():
    one = step_s(A100, LLAMA, 1, 0)
    assert one == pytest.approx(8.03e9 * 2 / 2039e9)  # ~7.9 ms: weight bytes over bandwidth
    assert step_s(A100, LLAMA, 1, 1000) > one  # the KV cache read adds to it
    huge = 4096
    assert step_s(A100, LLAMA, huge, 0) == pytest.approx(2 * 8.03e9 * huge / 312e12)  # FLOPs bound
    assert LLAMA.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB a token


def test_prefill_is_priced_by_flops_at_the_stated_efficiency():
    assert prefill_s(A100, LLAMA, 100) == pytest.approx(100 * 2 * 8.03e9 / (312e12 * PREFILL_EFFICIENCY))


def test_fewer_decoded_tokens_cost_less_gpu_time_where_decoding_dominates_and_the_batch_shares_a_step():
    cloud = {"steps": 90, "decoded_tokens": 90, "prompt_tokens": 40, "cached_tokens": 0, "engine_requests": 1}
    split = {"steps": 12, "decoded_tokens": 10, "prompt_tokens": 400, "cached_tokens": 150, "engine_requests": 5}
    out = estimate({"cloud": cloud, "split": split}, A100, LLAMA, [1, 64])
    assert out["estimate"] is True
    b1, b64 = out["batches"][1], out["batches"][64]
    assert b1["split_over_cloud_gpu"] < 0.5 and b1["split_over_cloud_latency_floor"] < 0.2
    # at a large batch a decode step is shared, so the prefill split adds weighs more: the saving shrinks
    assert b64["split_over_cloud_gpu"] > b1["split_over_cloud_gpu"]
    a = per_answer(cloud, A100, LLAMA, 64)
    assert a["gpu_ms"] == pytest.approx(a["decode_ms"] + a["prefill_ms"] + a["requests_ms"], abs=0.02)
    # prefill riding in memory-bound decode steps (vLLM's chunked prefill) costs less than prefill apart, never more
    out = estimate({"cloud": cloud, "split": split}, A100, LLAMA, [1, 64, 128, 1024])
    for b in (1, 64, 128, 1024):
        for plan in ("cloud", "split"):
            x = out["batches"][b][plan]
            assert x["requests_ms"] <= x["gpu_ms_chunked"] <= x["gpu_ms"] + 0.01, (b, plan)


def test_drafts_checked_inside_the_engine_cost_a_step_each_where_memory_binds_and_their_positions_where_flops_do():
    # the counts of one exact_split run inside the engine (8 open prompts, SmolLM2): one request, fewer steps than tokens
    cloud = {"steps": 63.5, "decoded_tokens": 63.5, "prompt_tokens": 37.5, "cached_tokens": 0, "engine_requests": 1}
    split = dict(cloud, steps=28.6, decoded_tokens=64, draft_tokens_offered=55.6, draft_tokens_accepted=35)
    out = estimate({"cloud": cloud, "split": split}, A100, LLAMA, [1, 16, 8192])
    assert out["batches"][1]["split_over_cloud_gpu"] == pytest.approx(28.6 / 63.5, rel=0.05)  # weights read per step
    assert out["batches"][16]["split_over_cloud_gpu"] < 0.6
    # compute-bound: every position is paid, the refused proposals' too
    big = out["batches"][8192]
    assert big["split"]["decode_ms"] / big["cloud"]["decode_ms"] == pytest.approx((64 + 55.6 - 35) / 63.5, rel=0.05)


def test_the_cli_reads_the_benchmarks_report_after_its_progress_lines(tmp_path, capsys):
    cost = {"steps": 9, "decoded_tokens": 9, "prompt_tokens": 20, "cached_tokens": 0, "engine_requests": 1}
    path = tmp_path / "r.json"
    path.write_text("[1/1] progress\n" + json.dumps({"per_answer": {"cloud": cost, "split": cost}}))
    assert main([str(path), "--batch", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batches"]["2"]["split_over_cloud_gpu"] == 1.0


def test_a_capacity_run_is_estimated_per_workload_for_every_system_whose_work_was_counted(tmp_path, capsys):
    split = {"steps": 12, "decoded_tokens": 10, "prompt_tokens": 400, "cached_tokens": 150, "engine_requests": 5}
    greedy = {"steps": 91, "decoded_tokens": 90, "prompt_tokens": 40, "cached_tokens": 32, "engine_requests": 1}
    ngram = {"decoded_tokens": 90, "prompt_tokens": 40, "engine_requests": 1}  # speculating: steps not reported
    run = {
        "workloads": {
            "arith": {
                "split": {"work_per_answer": split},
                "vllm-greedy": {"work_per_answer": greedy},
                "vllm-ngram": {"work_per_answer": ngram},
                "old": {},  # a system of a run before work was counted
            }
        }
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main([str(path), "--batch", "1"]) == 0
    row = json.loads(capsys.readouterr().out)["arith"]["batches"]["1"]
    assert set(row["split_capacity_over"]) == {"vllm-greedy", "vllm-ngram"}
    assert row["split_capacity_over"]["vllm-greedy"] > 1 and row["vllm-ngram"]["latency_floor_ms"] is None
