"""One co-inference session: verify drafts as they arrive, then refine (seed 003, 2.2).

Input: the edge's drafts and end-of-round markers (an async iterator).
Output: domain events (``coinfer.types``) in the order the edge should see them:
``SessionAccepted``, a ``Verdict`` per draft as soon as it is judged, then either
``AnswerChunk``s and a ``Summary``, or ``RetryAdvice`` and another round.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from cloud.config import CloudConfig
from cloud.engine import GenParams, TargetEngine
from cloud.policy import agreement, consensus_prefix, likelihood_score, load_scaled_g, rank_scores, refine_max_tokens
from cloud.verifier import JUDGE_MAX_TOKENS, JUDGE_SCHEMA, judge_prompt, parse_judge
from coinfer import types as t
from coinfer.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, field_of
from coinfer.rules import RuleSet
from coinfer.tasks import Parsed, Task
from coinfer.tasks.base import split_steps

log = logging.getLogger(__name__)


@dataclass
class DraftsDone:
    """End of a round of drafts (``count`` drafts were sent in it)."""

    count: int


EdgeItem = t.Draft | DraftsDone
_END = object()


def _join_steps(steps: list[str]) -> str:
    """Steps as an answer prefix the target continues: ``"a; b; "`` (empty for none)."""
    return "; ".join(steps) + "; " if steps else ""


@dataclass
class _Judged:
    draft: t.Draft
    verdict: t.Verdict
    support: int = 1  # 1 + structural duplicates merged into it
    parsed: Parsed | None = None


@dataclass
class Session:
    """State of one session; ``run`` drives it."""

    cfg: CloudConfig
    engine: TargetEngine
    req: t.OpenRequest
    task: Task
    spec: dict
    rules: RuleSet
    recommended_drafts: int
    deadline_s: float
    t0: float = field(default_factory=time.perf_counter)
    judged: dict[int, _Judged] = field(default_factory=dict)
    attempt: int = 0
    seen: set[int] = field(default_factory=set)
    # engine request ids must be unique across sessions even when two edges reuse a request_id
    key: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    weights: tuple[float, float, float] | None = None
    """Scheduler weights (a, b, g) in force; None = the configured ones."""
    load: float = 0.0
    """Engine load at open: raises the latency weight."""
    outcome: list[tuple[float, float, float, float]] = field(default_factory=list)
    """(score, agreement, latency_s, label) per ranked draft once finished: the learner's input."""

    def _ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    # ---- verification -------------------------------------------------------------
    async def _verify(self, d: t.Draft, pending: dict[tuple, asyncio.Future]) -> t.Verdict:
        t_start = time.perf_counter()
        res, parsed = self.rules.check(d.text)
        if not res.valid:  # rules fail fast: no model time spent
            v = t.Verdict(d.index, False, 0.0, res.error, res.failed_rule, 0.0, res.passed)
        else:
            key = self.task.structure_key(parsed)
            if key in pending:  # structural duplicate: counted as support, not verified twice
                orig = await asyncio.shield(pending[key])
                self.judged[orig.draft_index].support += 1
                v = t.Verdict(d.index, orig.valid, orig.score, orig.error, orig.failed_rule, 0.0,
                              orig.rules_passed, duplicate_of=orig.draft_index + 1)
            else:
                fut: asyncio.Future = asyncio.get_running_loop().create_future()
                pending[key] = fut
                try:
                    v = await self._llm_verdict(d, res.passed)
                except BaseException as exc:
                    fut.set_exception(exc)
                    fut.exception()  # mark retrieved
                    raise
                fut.set_result(v)
        v.verify_ms = (time.perf_counter() - t_start) * 1e3
        self.judged[d.index] = _Judged(d, v, support=0 if v.duplicate_of else 1, parsed=parsed)
        return v

    async def _llm_verdict(self, d: t.Draft, passed: list[str]) -> t.Verdict:
        if self.cfg.policy.verifier == "judge":
            text = await self.engine.judge(judge_prompt(self.req.prompt, d.text), JUDGE_SCHEMA, JUDGE_MAX_TOKENS,
                                           f"{self.key}-j{d.index}")
            valid, score, error = parse_judge(text)
            return t.Verdict(d.index, valid, score, error, "" if valid else "judge", 0.0,
                             passed + (["judge"] if valid else []))
        lps = await self.engine.continuation_logprobs(self.task.format_prompt(self.req.prompt), d.text,
                                                      f"{self.key}-v{d.index}")
        return t.Verdict(d.index, True, likelihood_score(lps), "", "", 0.0, passed + ["likelihood"])

    # ---- refinement ---------------------------------------------------------------
    def _ranked(self) -> list[tuple[_Judged, float]]:
        cands = [j for j in self.judged.values() if j.verdict.valid and not j.verdict.duplicate_of]
        if not cands:
            return []
        p = self.cfg.policy
        a, b, g = self.weights or (p.a, p.b, p.g)
        ranks = rank_scores([j.verdict.score for j in cands], [j.verdict.verify_ms / 1e3 for j in cands], a, b,
                            load_scaled_g(g, self.load))
        return sorted(zip(cands, ranks), key=lambda x: -x[1])

    def _outcome(self, ranked: list[tuple[_Judged, float]], answer: str) -> None:
        """Label each ranked draft for the weight learner: graded right, else agrees with the answer."""
        if not ranked:
            return
        agree = agreement([j.verdict.score for j, _ in ranked])
        final_key = self.task.structure_key(self.task.parse_answer(answer))
        for j, _ in ranked:
            try:
                label = float(self.task.grade(self.spec, j.parsed))
            except Exception:  # noqa: BLE001 - a task that cannot grade: agreement with the answer
                label = float(self.task.structure_key(j.parsed) == final_key)
            self.outcome.append((j.verdict.score, agree, j.verdict.verify_ms / 1e3, label))

    async def _generate(self, prefix: str, max_tokens: int, tag: str, out: asyncio.Queue) -> tuple[str, float, int]:
        """Stream the target's answer after ``prefix``; returns (text, time to first token ms, tokens)."""
        sp = self.req.refine
        params = GenParams(
            max_tokens=max_tokens,
            temperature=sp.temperature if sp else self.cfg.policy.refine_temperature,
            top_p=sp.top_p if sp else 1.0,
            presence_penalty=sp.presence_penalty if sp else 0.0,
            frequency_penalty=sp.frequency_penalty if sp else 0.0,
            seed=sp.seed if sp else None,
        )
        t_start, ttft = time.perf_counter(), 0.0
        if prefix:
            await out.put(t.AnswerChunk(prefix))
        text, tokens = prefix, 0
        async for delta in self.engine.generate(self.task.format_prompt(self.req.prompt) + prefix, params,
                                                f"{self.key}-{tag}"):
            if not ttft:
                ttft = (time.perf_counter() - t_start) * 1e3
            tokens += delta.tokens
            if delta.text:
                text += delta.text
                await out.put(t.AnswerChunk(delta.text))
        return text, ttft, tokens

    async def _finish(self, out: asyncio.Queue, verify_ms: float) -> None:
        ranked = self._ranked()
        p = self.cfg.policy
        t_ref = time.perf_counter()
        if ranked:
            chosen = [j for j, _ in ranked[: p.context_drafts]]
            steps = [split_steps(j.draft.text) for j, _ in ranked for _ in range(j.support)]
            best = ranked[0][0]
            # A fixed prefix only where the target itself finds the best draft likely: a
            # low score means the target would not write those steps, and forcing them
            # on it steers it down the draft's (wrong) path. Duplicated drafts from a
            # confident small model are support, but not independent evidence.
            use_prefix = p.consensus_prefix and best.verdict.score >= p.prefix_min_score
            prefix_steps = consensus_prefix(steps, min(p.min_support, len(steps))) if use_prefix else []
            prefix = _join_steps(prefix_steps)
            max_tokens = refine_max_tokens(best.verdict.score, p.refine_max_tokens)
            text, ttft, steps = await self._generate(prefix, max_tokens, f"r{self.attempt}", out)
            res, _ = self.rules.check(text)
            if res.valid:
                answer, source, valid = text, t.AnswerSource.REFINED, True
            else:  # never worse than the best valid draft
                answer, source, valid = best.draft.text, t.AnswerSource.DRAFT, True
            refine_note = f"refined with prefix of {len(prefix_steps)} steps" + (
                "" if res.valid else f"; refinement failed ({res.error}), best draft returned")
        else:
            # no valid draft: the cloud answers itself, continuing from the steps the
            # drafts got right before their first mistake (most common path first)
            chosen = []
            verified = [self.task.verified_prefix(self.spec, j.draft.text) for j in self.judged.values()]
            prefix_steps = consensus_prefix([v for v in verified if v], 1)
            prefix = _join_steps(prefix_steps)
            text, ttft, steps = await self._generate(prefix, p.refine_max_tokens, "cloud", out)
            res, _ = self.rules.check(text)
            if not res.valid and p.cloud_candidates > 0:
                # the greedy answer failed the rules: sample candidates in one batched
                # request and keep the first that passes
                cands = await self.engine.sample(
                    self.task.format_prompt(self.req.prompt) + prefix,
                    GenParams(max_tokens=p.refine_max_tokens, temperature=p.cloud_temperature),
                    p.cloud_candidates, f"{self.key}-cands")
                steps += max((c.tokens for c in cands), default=0)  # one batched request: the longest
                for cand in cands:
                    cand_res, _ = self.rules.check(prefix + cand.text)
                    if cand_res.valid:
                        text, res = prefix + cand.text, cand_res
                        break
            answer, source, valid = text, t.AnswerSource.CLOUD, res.valid
            refine_note = (f"no valid draft after retries: cloud drafted itself from {len(prefix_steps)} verified steps"
                           + ("" if res.valid else f" ({res.error})"))
        if self.cfg.policy.learn_every:  # grading every draft only feeds the learner
            self._outcome(ranked, answer)
        rank_of = {j.draft.index: r for j, r in ranked}
        scores = [t.DraftScore(i, j.verdict.valid, j.verdict.score, rank_of.get(i, 0.0))
                  for i, j in sorted(self.judged.items())]
        trace = "; ".join(
            f"Draft#{j.draft.index} " + (f"scored {j.verdict.score:.2f}, passed {','.join(j.verdict.rules_passed)}"
                                         if j.verdict.valid else f"failed {j.verdict.failed_rule}: {j.verdict.error}")
            for j in self.judged.values()) + f" | {refine_note}"
        await out.put(t.Summary(
            answer=answer, source=source, chosen_drafts=[j.draft.index for j in chosen], scores=scores,
            timings=t.Timings(verify_ms, ttft, (time.perf_counter() - t_ref) * 1e3, self._ms(), steps),
            trace=f"[THINKING_TRACE: {trace}]", answer_valid=valid,
            recommended_drafts=self.recommended_drafts, request_id=self.req.request_id,
        ))

    def _advice(self) -> t.RetryAdvice:
        errors: dict[str, int] = {}
        for j in self.judged.values():
            if not j.verdict.valid:
                code = field_of(j.verdict.error)
                errors[code] = errors.get(code, 0) + 1
        reason = ", ".join(f"{k} x{n}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1])) or "no drafts"
        # explore more each round: hotter, more diverse, a few more drafts
        base = t.SamplingParams()
        sampling = t.SamplingParams(
            temperature=min(1.5, base.temperature + 0.3 * self.attempt), top_p=base.top_p,
            presence_penalty=min(2.0, base.presence_penalty + 0.2 * self.attempt),
            frequency_penalty=min(2.0, base.frequency_penalty + 0.1 * self.attempt),
            max_new_tokens=base.max_new_tokens,
        )
        n = min(self.cfg.limits.max_drafts - len(self.seen), self.recommended_drafts + 2 * self.attempt)
        return t.RetryAdvice(self.attempt, n, sampling, reason)

    # ---- driver ---------------------------------------------------------------------
    async def _consume(self, inbox: AsyncIterator[EdgeItem], out: asyncio.Queue) -> None:
        round_tasks: list[asyncio.Task] = []
        pending: dict[tuple, asyncio.Future] = {}

        async def verify_and_emit(d: t.Draft) -> None:
            await out.put(await self._verify(d, pending))

        try:
            await self._rounds(inbox, out, round_tasks, pending, verify_and_emit)
        finally:  # a cancelled or failed session stops its verifications (and their vLLM requests)
            for tk in round_tasks:
                tk.cancel()
            await asyncio.gather(*round_tasks, return_exceptions=True)

    async def _rounds(self, inbox: AsyncIterator[EdgeItem], out: asyncio.Queue, round_tasks: list[asyncio.Task],
                      pending: dict, verify_and_emit) -> None:
        lim = self.cfg.limits
        sent_in_round = 0
        async for item in inbox:
            if isinstance(item, t.Draft):
                if item.index in self.seen:
                    raise InvalidArgument(f"draft.index: {item.index} was already sent")
                if len(item.text) > lim.max_draft_chars:
                    raise ResourceExhausted(f"draft.text: {len(item.text)} chars > limit {lim.max_draft_chars}")
                if len(self.seen) >= lim.max_drafts:
                    raise ResourceExhausted(f"draft: more than {lim.max_drafts} drafts in one session")
                self.seen.add(item.index)
                round_tasks.append(asyncio.create_task(verify_and_emit(item), name=f"d{item.index}"))
                sent_in_round += 1
                continue
            if item.count != sent_in_round:
                raise InvalidArgument(f"done.count: {item.count} but {sent_in_round} drafts were sent this round")
            await asyncio.gather(*round_tasks)
            verify_ms = self._ms()
            round_tasks.clear()
            sent_in_round = 0
            budget_left = self.cfg.limits.max_drafts - len(self.seen)
            if self._ranked() or self.attempt >= self.cfg.policy.max_retries or budget_left < 1:
                await self._finish(out, verify_ms)
                return
            self.attempt += 1
            await out.put(self._advice())
        # the edge closed its side without finishing a round: answer from what we have
        await asyncio.gather(*round_tasks)
        await self._finish(out, self._ms())

    async def run(self, inbox: AsyncIterator[EdgeItem]) -> AsyncIterator[t.CloudEvent]:
        out: asyncio.Queue = asyncio.Queue()
        yield t.SessionAccepted(self.req.request_id, self.rules.labels, self.recommended_drafts)

        async def consume() -> None:
            try:
                async with asyncio.timeout(self.deadline_s):
                    await self._consume(inbox, out)
                await out.put(_END)
            except TimeoutError:
                await out.put(DeadlineExceeded(f"deadline_ms: session exceeded its {self.deadline_s * 1e3:.0f} ms deadline"))
            except BaseException as exc:  # hand every failure to the reader below
                await out.put(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

        task = asyncio.create_task(consume())
        try:
            while True:
                ev = await out.get()
                if ev is _END:
                    return
                if isinstance(ev, BaseException):
                    raise ev
                yield ev
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
