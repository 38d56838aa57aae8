"""The plain-vLLM baselines of ``benchmarks.capacity``: one request to vLLM's own OpenAI server as a user of plain vLLM
would send it, and the engine work its usage counts.

- ``vllm-greedy``: greedy, streamed, the cloud's answer budget;
- ``vllm-repair``: the same, then coinfer's own checkers and calculator on the answer in the client
  (``RuleSet.check_repaired``: a wrong computed value rewritten in place, the model's choices kept) -- what a user of
  plain vLLM could script with the same checkers, so that split's gain over it is co-inference's, not the checkers';
- ``vllm-resample``: ``vllm-repair``, and an answer the checkers still refuse sampled again (temperature
  ``RESAMPLE_TEMPERATURE``, seeded) up to ``RESAMPLES`` times, the first the checkers pass taken (else the first);
- ``vllm-best-of-5``: ``n=5`` at temperature 0.7, majority vote on the extracted answer.

The checkers run in this process (the load generator's core), not on the replica: their CPU is not in the replica's
column, as a client's would not be.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter

from benchmarks.capacity_ladder import Request, Result
from benchmarks.load_stats import work_tokens

BEST_OF = 5
BEST_OF_TEMPERATURE = 0.7
RESAMPLES = 2
RESAMPLE_TEMPERATURE = 0.7
CHECKED = ("vllm-repair", "vllm-resample")
PLAIN_SERVER = ("vllm-greedy", *CHECKED, "vllm-best-of-5")
"""The systems that share one plain vLLM server (the n-gram baseline has a server of its own)."""


def work(usage, steps_known: bool = True) -> dict | None:
    """vLLM's usage as ``load_stats.WORK_KEYS``: one request, its prompt (one prefill for all ``samples``) with the
    prefix cache's hits where the server reports them (``--enable-prompt-tokens-details``), every completion token
    decoded; its sequential steps only where ``steps_known`` (one sample: a prefill and one step a token; several
    samples' longest is not in the usage, and a speculating server's steps are fewer than its tokens)."""
    if usage is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    out = {
        "engine_requests": 1,
        "prompt_tokens": usage.prompt_tokens,
        "scored_tokens": 0,
        "decoded_tokens": usage.completion_tokens,
    }
    # the servers here run with --enable-prompt-tokens-details: no details is no hit (older vLLMs leave them out then)
    out["cached_tokens"] = (details.cached_tokens or 0) if details is not None else 0
    if steps_known:
        out["steps"] = 1 + usage.completion_tokens
    return out


def _add(a: dict | None, b: dict | None) -> dict | None:
    """Two requests' work, one after the other (a key either lacks is unknown for both)."""
    if a is None or b is None:
        return None
    return {k: a[k] + b[k] for k in a if k in b}


def tokens(usage) -> int | None:
    """vLLM's usage as engine tokens, as coinfer's ``CloudCost.work_tokens`` counts them: the prompt past the prefix
    cache (one prefill for all n samples) and every completion token."""
    return work_tokens(work(usage))


async def _stream(client, model: str, req: Request, t0: float, temperature: float = 0.0, seed: int | None = None):
    """One streamed chat completion: (text, time to first content, usage)."""
    text, ttft, used = "", 0.0, None
    stream = await client.chat.completions.create(
        model=model,
        messages=req.messages,
        max_tokens=req.max_tokens,
        temperature=temperature,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            ttft = ttft or time.perf_counter() - t0
            text += c.choices[0].delta.content
        used = c.usage or used
    return text, ttft, used


async def ask_greedy(client, model: str, req: Request, speculative: bool = False) -> Result:
    """Plain vLLM greedy (``speculative``: the server speculates, so its steps are not its tokens)."""
    t0 = time.perf_counter()
    text, ttft, used = await _stream(client, model, req, t0)
    lat = time.perf_counter() - t0
    w = work(used, steps_known=not speculative)
    return Result(req.grade(text), lat, ttft or lat, source="greedy", work=w)


@functools.lru_cache(maxsize=4096)
def _ruleset(kind: str, prompt: str):
    """The checkers coinfer's cloud would hold a ``kind`` problem's answer to (its task's, or the request's rules)."""
    from benchmarks.open_accuracy import Case
    from coinfer.rules import RuleSet
    from coinfer.tasks import get_task

    case = Case(kind, prompt, None)
    task = get_task(case.task)
    return RuleSet(case.rules(), task, task.parse_problem(prompt), extraction=case.extraction())


def checked(req: Request, text: str) -> tuple[bool, str]:
    """(whether the checkers pass ``text`` or its calculator repair, the text they judged)."""
    res, _, judged, _ = _ruleset(req.case.kind, req.case.prompt).check_repaired(text)
    return res.valid, judged


async def ask_checked(client, model: str, req: Request, resamples: int) -> Result:
    """``vllm-repair`` (``resamples`` 0) or ``vllm-resample``: greedy, the checkers and calculator on the answer,
    and up to ``resamples`` seeded samples more while they refuse it. Open prompts have no checkers: greedy."""
    t0 = time.perf_counter()
    text, ttft, used = await _stream(client, model, req, t0)
    total = work(used)
    if req.case is None:
        lat = time.perf_counter() - t0
        return Result(None, lat, ttft or lat, source="greedy", work=total)
    ok, answer = await asyncio.to_thread(checked, req, text)
    first, source = answer, "greedy" + ("" if ok else ":refused")
    for i in range(resamples if not ok else 0):
        again, _, used = await _stream(client, model, req, t0, RESAMPLE_TEMPERATURE, seed=i + 1)
        total = _add(total, work(used))
        ok, answer = await asyncio.to_thread(checked, req, again)
        if ok:
            source = f"resample{i + 1}"
            break
    lat = time.perf_counter() - t0
    final = answer if ok else first
    # what a client shows first: the greedy stream where it stood, else the answer once chosen
    shown = ttft if source.startswith("greedy") and final == text else lat
    return Result(req.grade(final), lat, shown or lat, source=source, work=total)


async def ask_best_of(client, model: str, req: Request) -> Result:
    t0 = time.perf_counter()
    r = await client.chat.completions.create(
        model=model, messages=req.messages, max_tokens=req.max_tokens, temperature=BEST_OF_TEMPERATURE, n=BEST_OF
    )
    texts = [c.message.content or "" for c in r.choices]
    lat = time.perf_counter() - t0
    w = work(r.usage, steps_known=False)
    if req.case is None:  # open prose: nothing to vote on
        return Result(None, lat, lat, source="vote", work=w)
    votes = Counter(k for x in texts if (k := req.case.vote_key(x)) is not None)
    winner = votes.most_common(1)[0][0] if votes else None
    text = next((x for x in texts if winner is not None and req.case.vote_key(x) == winner), texts[0])
    return Result(req.grade(text), lat, lat, source="vote", work=w)


def asker(system: str, client, model: str):
    """The ``Ask`` of a plain-vLLM ``system`` on that server."""
    if system == "vllm-best-of-5":
        return lambda r, rid: ask_best_of(client, model, r)
    if system in CHECKED:
        n = RESAMPLES if system == "vllm-resample" else 0
        return lambda r, rid: ask_checked(client, model, r, n)
    return lambda r, rid: ask_greedy(client, model, r, speculative=system == "vllm-ngram")
