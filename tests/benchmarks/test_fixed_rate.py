"""``benchmarks.fixed_rate``'s summary of a run's rows (the run itself needs the replica: run by hand)."""

from benchmarks.fixed_rate import summary


def _row(latency: float, requests: int, prompt: int, cached: int, decoded: int, ok: bool | None = True) -> dict:
    work = {"engine_requests": requests, "prompt_tokens": prompt, "cached_tokens": cached, "decoded_tokens": decoded}
    return {"latency_s": latency, "ttft_s": latency / 2, "ok": ok, "source": "split", "failed": "", "work": work}


def test_the_summary_puts_each_answers_work_beside_its_latency():
    rows = [_row(0.1 * (i + 1), 2, 100, 64, 2) for i in range(19)] + [_row(5.0, 6, 300, 128, 40, ok=False)]
    s = summary(rows)
    assert s["answers"] == 20 and s["failed"] == 0 and s["accuracy"] == 0.95
    assert s["p50_s"] == 1.1 and s["p95_s"] == 5.0  # the 20th of 20 is the p95 here
    assert s["per_answer"] == {"engine_requests": 2.2, "computed_prompt": 42.8, "cached": 67.2, "decoded": 3.9}
    assert s["answers_by_engine_requests"] == {2: 19, 6: 1}
    assert s["slowest"][-1]["latency_s"] == 5.0 and s["slowest"][-1]["engine_requests"] == 6


def test_open_prompts_have_no_accuracy_and_a_failed_request_no_work():
    rows = [_row(0.2, 1, 50, 0, 10, ok=None), {**_row(9.0, 0, 0, 0, 0, ok=None), "work": None, "failed": "Timeout"}]
    s = summary(rows)
    assert s["accuracy"] is None and s["failed"] == 1 and s["per_answer"]["engine_requests"] == 1.0
