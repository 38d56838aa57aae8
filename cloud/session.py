"""One co-inference session: verify drafts as they arrive, then refine (docs/design.md §2.2).

Input: the edge's drafts and end-of-round markers (an async iterator).
Output: domain events (``coinfer.types``) in the order the edge should see them:
``SessionAccepted``, a ``Verdict`` per draft as soon as it is judged, then either
``AnswerChunk``s and a ``Summary``, or ``RetryAdvice`` and another round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from coinfer.cloud.config import CloudConfig
from coinfer.cloud.engine import GenParams, TargetEngine
from coinfer.cloud.policy import (
    answer_agreement,
    consensus_prefix,
    likelihood_score,
    load_scaled_g,
    mean_logprob,
    rank_scores,
    refine_max_tokens,
)
from coinfer.cloud.verifier import JUDGE_MAX_TOKENS, JUDGE_SCHEMA, judge_prompt, parse_judge

from coinfer import types as t
from coinfer.chat import refine_question, with_question
from coinfer.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, field_of
from coinfer.repetition import repetition_error
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN, Parsed, Task
from coinfer.tasks.base import split_steps

log = logging.getLogger(__name__)


@dataclass
class DraftsDone:
    """End of a round of drafts (``count`` drafts were sent in it)."""

    count: int


EdgeItem = t.Draft | DraftsDone
_END = object()


LOOP_CHECK_TOKENS = 16
"""How often (in generated tokens) the cloud's own generation is checked for a loop."""


def _join_steps(steps: list[str]) -> str:
    """Steps as an answer prefix the target continues: ``"a; b;"`` (empty for none). No trailing
    space: byte-level BPEs merge a space into the next word (``" AC"`` is one token), so a prefix
    ending in a lone space token is text the target never saw, and it continued select's steps
    without their ids (``"AB 11>10; 14>10; ..."``)."""
    return "; ".join(steps) + ";" if steps else ""


def _finish_reason(engine_reason: str | None, current: str = "stop") -> str:
    """The OpenAI finish reason of a generation from the engine's: "length" when it hit its budget."""
    return "length" if engine_reason == "length" else current if engine_reason is None else "stop"


def _scaffolding_error(text: str, template: str) -> str:
    """An answer that contains the refinement template's own words (its lines of >= 12 chars
    between placeholders) copied the prompt instead of answering."""
    for part in template.replace("{question}", "\0").replace("{candidates}", "\0").split("\0"):
        for line in part.split("\n"):
            if len(line.strip()) >= 12 and line.strip() in text:
                return f"scaffolding: the refinement copies the prompt's {line.strip()!r}"
    return ""


def _strip_candidate_label(text: str, candidate_format: str, n: int) -> str:
    """``text`` without a leading candidate label ("(1) ") copied from the refinement prompt."""
    head = candidate_format.split("{text}", 1)[0]
    stripped = text.lstrip()
    for i in range(1, n + 1):
        label = head.format(n=i)
        if label.strip() and stripped.startswith(label):
            return stripped[len(label):]
    return text


@dataclass
class _Judged:
    draft: t.Draft
    verdict: t.Verdict
    support: int = 1  # 1 + structural duplicates merged into it
    parsed: Parsed | None = None


@dataclass
class _Answer:
    """How the session answered: what the Summary reports (cloud work in ``steps`` decode steps and
    ``generated`` tokens, a batch of candidates counting each)."""

    text: str
    source: t.AnswerSource
    valid: bool
    parsed: Parsed | None
    chosen: list[_Judged]
    mode: str
    finish: str
    note: str
    ttft_ms: float = 0.0
    steps: int = 0
    generated: int = 0


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
    min_logprob: dict[int, float] = field(default_factory=dict)
    """Per verified draft: its least likely token's logprob under the target (likelihood verifier)."""
    mean_lp: dict[int, float] = field(default_factory=dict)
    """Per verified draft: its mean per-token logprob under the target (likelihood verifier)."""
    shown: str = ""
    """The answer text streamed so far (since the last reset): an answer other than it withdraws it first."""

    def _ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    # ---- verification -------------------------------------------------------------
    @functools.cached_property
    def prompt_text(self) -> str:
        """The conversation rendered with the target's chat template (computed once)."""
        return self.engine.render(self.req.conversation)

    @property
    def _thresholded(self) -> bool:
        """The likelihood threshold judges open requests; a built-in preset's checkers are exact."""
        return self.task is OPEN

    async def _verify(self, d: t.Draft, pending: dict) -> t.Verdict:
        t_start = time.perf_counter()
        res, parsed = await asyncio.to_thread(self.rules.check, d.text)  # client rules: off the loop
        if not res.valid:  # rules fail fast: no model time spent
            v = t.Verdict(draft_index=d.index, valid=False, error=res.error, failed_rule=res.failed_rule,
                          rules_passed=res.passed)
        else:
            key = self.task.dedup_key(d.text, parsed)
            if key in pending:  # a duplicate: counted as support, not verified twice
                orig = await asyncio.shield(pending[key])
                self.judged[orig.draft_index].support += 1
                if orig.draft_index in self.min_logprob:
                    self.min_logprob[d.index] = self.min_logprob[orig.draft_index]
                    self.mean_lp[d.index] = self.mean_lp[orig.draft_index]
                v = dataclasses.replace(orig, draft_index=d.index, verify_ms=0.0, duplicate_of=orig.draft_index + 1)
            else:
                fut: asyncio.Future = asyncio.get_running_loop().create_future()
                pending[key] = fut
                try:
                    v = await self._llm_verdict(d.index, d.text, res.passed, own=d.mean_logprob, truncated=d.truncated)
                except BaseException as exc:
                    fut.set_exception(exc)
                    fut.exception()  # mark retrieved
                    raise
                fut.set_result(v)
        v.verify_ms = (time.perf_counter() - t_start) * 1e3
        self.judged[d.index] = _Judged(d, v, support=0 if v.duplicate_of else 1, parsed=parsed)
        return v

    def _floor(self, own: float | None) -> float:
        """The likelihood threshold for a draft whose model gave it mean logprob ``own`` (None: the
        absolute one). Relative to the draft model's own confidence, so that free prose (a real
        model's drafts score -0.6..-2 per token: natural text is not formulaic) passes where the
        target agrees with the draft model, and text the target finds far less likely than the draft
        model did fails; never stricter than ``min_mean_logprob``, never looser than its floor."""
        p = self.cfg.policy
        if own is None or not own < 0.0 or p.relative_margin is None:  # proto3: 0 = not reported
            return p.min_mean_logprob
        return max(p.min_mean_logprob_floor, min(p.min_mean_logprob, own - p.relative_margin))

    async def _llm_verdict(self, index: int, text: str, passed: list[str], own: float | None = None,
                           truncated: bool = False) -> t.Verdict:
        if self.cfg.policy.verifier == t.VerifierKind.JUDGE:
            out = await self.engine.judge(judge_prompt(self.req.question, text), JUDGE_SCHEMA, JUDGE_MAX_TOKENS,
                                          f"{self.key}-j{index}")
            valid, score, error = parse_judge(out)
            return t.Verdict(draft_index=index, valid=valid, score=score, error=error,
                             failed_rule="" if valid else t.VerifierKind.JUDGE.value,
                             rules_passed=passed + ([t.VerifierKind.JUDGE.value] if valid else []))
        lps = await self.engine.continuation_logprobs(self.prompt_text, text, f"{self.key}-v{index}", end=not truncated)
        mean = mean_logprob(lps)
        if index >= 0 and lps:
            self.min_logprob[index], self.mean_lp[index] = min(lps), mean
        floor = self._floor(own)
        if self._thresholded and mean < floor:
            return t.Verdict(draft_index=index, valid=False, score=likelihood_score(lps), failed_rule=t.VerifierKind.LIKELIHOOD.value,
                             error=f"low_likelihood: mean logprob {mean:.2f} < {floor:.2f} per token",
                             rules_passed=passed)
        return t.Verdict(draft_index=index, valid=True, score=likelihood_score(lps), rules_passed=passed + [t.VerifierKind.LIKELIHOOD.value])

    # ---- ranking ------------------------------------------------------------------
    def _ranked(self) -> list[tuple[_Judged, float, float]]:
        """Valid drafts, best first: (judged, rank score, agreement on the extracted answer). A draft
        that ended by itself comes before one cut at its budget, whatever their scores (as the edge's
        local choice): a truncated draft's likelihood is that of an answer that never reached its
        end (SmolLM2: a French ramble cut at 64 tokens outranked "The capital of France is Paris.")."""
        cands = [j for j in self.judged.values() if j.verdict.valid and not j.verdict.duplicate_of]
        if not cands:
            return []
        p = self.cfg.policy
        a, b, g = self.weights or (p.a, p.b, p.g)
        agree = answer_agreement([self.task.answer_key(j.parsed) for j in cands], [j.support for j in cands])
        ranks = rank_scores([j.verdict.score for j in cands], [j.verdict.verify_ms / 1e3 for j in cands], a, b,
                            load_scaled_g(g, self.load), agree=agree)
        return sorted(zip(cands, ranks, agree), key=lambda x: (x[0].draft.truncated, -x[1]))

    def _outcome(self, ranked: list[tuple[_Judged, float, float]], answer: str) -> None:
        """Label each ranked draft for the weight learner: graded right, else agrees with the answer."""
        final_key = self.task.answer_key(self.rules.parse(answer))
        for j, _, agree in ranked:
            try:
                label = float(self.task.grade(self.spec, j.parsed))
            except Exception:  # noqa: BLE001 - a task that cannot grade: agreement with the answer
                label = float(self.task.answer_key(j.parsed) == final_key)
            self.outcome.append((j.verdict.score, agree, j.verdict.verify_ms / 1e3, label))

    # ---- refinement ---------------------------------------------------------------
    def _params(self, max_tokens: int) -> GenParams:
        """The request's sampling (temperature, top_p, penalties, seed, stop), else the policy's."""
        sp = self.req.refine
        if sp is None:
            return GenParams(max_tokens=max_tokens, temperature=self.cfg.policy.refine_temperature)
        return GenParams(max_tokens=min(max_tokens, sp.max_new_tokens), temperature=sp.temperature, top_p=sp.top_p,
                         presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty, seed=sp.seed,
                         stop=sp.stop)

    async def _generate(self, prompt: str, prefix: str, max_tokens: int, tag: str,
                        out: asyncio.Queue) -> tuple[str, float, int, str]:
        """Stream the target's answer to ``prompt`` after ``prefix``; returns (text, TTFT ms, tokens,
        finish reason: "stop" or "length"). A generation that falls into a loop is stopped there
        (checked every ``LOOP_CHECK_TOKENS``; reported "length"): the rules would refuse it anyway, and
        SmolLM2's looping greedy haiku otherwise ran to its 192-token budget before candidates began."""
        t_start, ttft = time.perf_counter(), 0.0
        if prefix:
            await self._chunk(out, prefix)
        text, tokens, finish, checked = prefix, 0, "stop", 0
        stream = self.engine.generate(prompt + prefix, self._params(max_tokens), f"{self.key}-{tag}")
        async with contextlib.aclosing(stream):  # leaving early closes it: the engine aborts the request
            async for delta in stream:
                if not ttft:
                    ttft = (time.perf_counter() - t_start) * 1e3
                tokens += delta.tokens
                finish = _finish_reason(delta.finish_reason, finish)
                if delta.text:
                    text += delta.text
                    await self._chunk(out, delta.text)
                if tokens - checked >= LOOP_CHECK_TOKENS and delta.finish_reason is None:
                    checked = tokens
                    if repetition_error(text):  # linear in the text, which is bounded by max_tokens
                        finish = "length"
                        break
        return text, ttft, tokens, finish

    async def _accept(self, text: str, likelihood: bool = True, than: float | None = None,
                      truncated: bool = False) -> tuple[bool, str, Parsed]:
        """Re-verify a refined answer as a draft: extraction + rules, then the verifier's threshold,
        relative to ``than`` (the target's mean logprob of the draft the answer would replace: a
        refinement of free prose scored -0.81 against the conversation, under the absolute -0.5,
        where the draft it refined scored -0.75). ``likelihood=False`` for the target's own answers:
        its greedy answer *is* its most likely one, and a threshold set for drafts of free prose
        would refuse it (then sample candidates, refuse those too, and run into the deadline)."""
        res, parsed = await asyncio.to_thread(self.rules.check, text)
        if not res.valid:
            return False, f"{res.failed_rule}: {res.error}", parsed
        if likelihood and self._thresholded and self.cfg.policy.verifier == t.VerifierKind.LIKELIHOOD:
            v = await self._llm_verdict(-1, text, res.passed, own=than, truncated=truncated)
            if not v.valid:
                return False, v.error, parsed
        return True, "", parsed

    def _agreement_key(self, text: str, parsed: Parsed | None) -> object:
        """What two answers must share to agree: the extracted answer, else the text (whitespace aside)."""
        key = self.task.answer_key(parsed) if parsed is not None and parsed.ok else None
        return key if key is not None else " ".join(text.split())

    def _consensus(self, ranked: list[tuple[_Judged, float, float]]) -> object | None:
        """The answer every verified draft gives, when >= 2 drafts (duplicates count) give it; else None."""
        keys = {self._agreement_key(j.draft.text, j.parsed) for j, _, _ in ranked}
        return keys.pop() if len(keys) == 1 and sum(j.support for j, _, _ in ranked) >= 2 else None

    async def _refinement_error(self, ranked: list[tuple[_Judged, float, float]], text: str, parsed: Parsed) -> str:
        """Why a refinement that passed the rules must still not replace the drafts: it contradicts
        what the drafts agree on and the target does not clearly prefer it
        (``PolicyConfig.refine_override_nats``)."""
        p = self.cfg.policy
        agreed = self._consensus(ranked)
        if agreed is None or self._agreement_key(text, parsed) == agreed:
            return ""
        best = ranked[0][0]
        if p.verifier == t.VerifierKind.LIKELIHOOD and best.draft.index in self.mean_lp:
            lps = await self.engine.continuation_logprobs(self.prompt_text, text, f"{self.key}-o{self.attempt}")
            mean, floor = mean_logprob(lps), self.mean_lp[best.draft.index] + p.refine_override_nats
            if lps and mean >= floor:
                return ""
            return (f"contradicts: the drafts agree and the target prefers them (refinement mean logprob "
                    f"{mean:.2f} < {floor:.2f} per token)")
        return "contradicts: the drafts agree on another answer"

    def _accept_as_is(self, ranked: list[tuple[_Judged, float, float]]) -> str:
        """The best verified draft is the answer as it stands: the target finds it likely (mean and
        least likely token) and the drafts agree on its answer. Refining it would spend cloud decode
        tokens to write what the draft already says. Returns "" to accept, else why not (the trace)."""
        p = self.cfg.policy
        best, _, agree = ranked[0]
        min_lp = self.min_logprob.get(best.draft.index, 0.0 if p.verifier == t.VerifierKind.JUDGE else -float("inf"))
        if self.task is OPEN and self.task.answer_key(best.parsed) is None:
            return self._accept_free_text(best, min_lp)
        if best.verdict.score < p.accept_min_score:
            return f"score {best.verdict.score:.2f} < {p.accept_min_score:.2f}"
        if agree < p.accept_min_agreement:
            return f"agreement {agree:.2f} < {p.accept_min_agreement:.2f}"
        if min_lp < p.accept_min_token_logprob:
            return f"a token at logprob {min_lp:.2f} < {p.accept_min_token_logprob:.2f}"
        return ""

    def _accept_free_text(self, best: _Judged, min_lp: float) -> str:
        """Free text (nothing to extract, so nothing for drafts to agree on, and prose never scores
        like a formula): the draft stands when the target finds it about as likely as the draft model
        did (``PolicyConfig.accept_free_text_margin``) with no token it finds very unlikely. A real
        model's INT8 draft is that model's own answer; refining it doubled split's latency (SmolLM2:
        13.4 s against the cloud plan's 6.8 s) to rewrite the same prose."""
        p = self.cfg.policy
        own, mean = best.draft.mean_logprob, self.mean_lp.get(best.draft.index)
        if p.accept_free_text_margin is None or mean is None or not own < 0.0:  # proto3: 0 = not reported
            return "free text: no relative likelihood to judge it by"
        if mean < own - p.accept_free_text_margin:
            return f"free text: target mean logprob {mean:.2f} < own {own:.2f} - {p.accept_free_text_margin:.2f}"
        if min_lp < p.accept_free_text_min_token_logprob:
            return f"free text: a token at logprob {min_lp:.2f} < {p.accept_free_text_min_token_logprob:.2f}"
        return ""

    def _refine_plan(self, ranked: list[tuple[_Judged, float, float]]) -> tuple[str, str, str, list[_Judged]]:
        """(mode, model prompt, forced prefix, drafts used): continue a verified step prefix where
        the best draft is one the target itself finds likely, else the best drafts as candidates."""
        p = self.cfg.policy
        best = ranked[0][0]
        if self.task is not OPEN and p.consensus_prefix and best.verdict.score >= p.prefix_min_score:
            # A fixed prefix only where the target finds the best draft likely: a low score means
            # the target would not write those steps, and forcing them steers it down the
            # draft's (wrong) path. Duplicates from a confident small model are support, not
            # independent evidence.
            steps = [split_steps(j.draft.text) for j, _, _ in ranked for _ in range(j.support)]
            prefix_steps = consensus_prefix(steps, min(p.min_support, len(steps)))
            if prefix_steps:
                return t.RefineMode.PREFIX, self.prompt_text, _join_steps(prefix_steps), [best]
        chosen = [j for j, _, _ in ranked[: p.context_drafts]]  # duplicates were merged at verification
        conv = self.req.conversation
        question = refine_question(self.req.question, [j.draft.text for j in chosen], p.refine_template,
                                   p.candidate_format)
        return t.RefineMode.CANDIDATES, self.engine.render(with_question(conv, question)), "", chosen

    async def _finish(self, out: asyncio.Queue, verify_ms: float) -> None:
        """The session's answer once the drafts are in: the best verified draft as is, a refinement
        of the drafts, or (no valid draft) the cloud's own answer; then the Summary."""
        ranked = self._ranked()
        t_ref = time.perf_counter()
        not_as_is = self._accept_as_is(ranked) if ranked else ""
        if ranked and not not_as_is and self._cut_short(ranked[0][0]):
            a = await self._answer_continued(ranked, out)
        elif ranked and not not_as_is:
            a = await self._answer_as_is(ranked, out)
        elif ranked:
            a = await self._answer_refined(ranked, not_as_is, out)
        else:
            a = await self._answer_alone(out)
        if self.cfg.policy.learn_every:  # grading every draft only feeds the learner; parses client text: off the loop
            await asyncio.to_thread(self._outcome, ranked, a.text)
        await out.put(self._summary(ranked, a, t.Timings(verify_ms, a.ttft_ms, (time.perf_counter() - t_ref) * 1e3,
                                                         self._ms(), a.steps, a.generated)))

    @staticmethod
    def _draft_answer(best: _Judged, mode: str, note: str) -> _Answer:
        return _Answer(best.draft.text, t.AnswerSource.DRAFT, True, best.parsed, [best], mode,
                       "length" if best.draft.truncated else "stop", note)

    async def _answer_as_is(self, ranked: list[tuple[_Judged, float, float]], out: asyncio.Queue) -> _Answer:
        best, _, agree = ranked[0]
        await self._chunk(out, best.draft.text)
        return self._draft_answer(best, t.RefineMode.ACCEPTED,
                                  f"best draft accepted as is (score {best.verdict.score:.2f}, agreement {agree:.2f})")

    @property
    def _answer_budget(self) -> int:
        """The tokens this request gives the cloud's answer: the policy's, or less when the request asks."""
        return self._params(self.cfg.policy.refine_max_tokens).max_tokens

    def _cut_short(self, best: _Judged) -> bool:
        """The best draft stopped at the edge's draft budget, shorter than the answer budget this request
        gives the cloud (drafts: 256 tokens by default, the cloud's answer 512): taken as is, the answer
        would end where the target's own would not."""
        return best.draft.truncated and self._answer_budget > best.draft.num_tokens

    async def _answer_continued(self, ranked: list[tuple[_Judged, float, float]], out: asyncio.Queue) -> _Answer:
        """A draft good enough to take as is but cut at the draft budget: the target continues it to the
        answer's own budget (the draft is the verified prefix; only the rest is decoded). A continuation
        that fails the rules (a loop) is dropped: the draft as it stands."""
        best, _, agree = ranked[0]
        text, ttft, steps, finish = await self._generate(self.prompt_text, best.draft.text,
                                                         self._answer_budget - best.draft.num_tokens, "c", out)
        ok, why, parsed = await self._accept(text, likelihood=False)
        note = (f"best draft accepted as is (score {best.verdict.score:.2f}, agreement {agree:.2f}), "
                f"cut at its {best.draft.num_tokens}-token budget: continued by the target")
        if ok:
            a = _Answer(text, t.AnswerSource.REFINED, True, parsed, [best], t.RefineMode.PREFIX, finish, note)
        else:
            a = self._draft_answer(best, t.RefineMode.ACCEPTED, f"{note}; the continuation failed ({why}), draft returned")
            await self._replace_streamed(out, a.text, f"continuation rejected: {why}")
        a.ttft_ms, a.steps, a.generated = ttft, steps, steps
        return a

    async def _answer_refined(self, ranked: list[tuple[_Judged, float, float]], not_as_is: str,
                              out: asyncio.Queue) -> _Answer:
        """The target refines the drafts (a verified prefix continued, or candidates in the prompt); a
        refinement that fails the rules, leaks the template, is unlikely or contradicts what the drafts
        agree on is withdrawn and the best draft returned: never worse than the best valid draft."""
        p = self.cfg.policy
        best = ranked[0][0]
        mode, prompt, prefix, chosen = self._refine_plan(ranked)
        # latency-aware budget (docs/design.md §4.4), but never shorter than twice the longest draft used
        max_tokens = max(refine_max_tokens(best.verdict.score, p.refine_max_tokens),
                         min(p.refine_max_tokens, 2 * max(j.draft.num_tokens for j in chosen) + 16))
        text, ttft, steps, finish = await self._generate(prompt, prefix, max_tokens, f"r{self.attempt}", out)
        if mode is t.RefineMode.CANDIDATES:
            text = _strip_candidate_label(text, p.candidate_format, len(chosen))
        if why := _scaffolding_error(text, p.refine_template):
            ok, parsed = False, None
        else:
            ok, why, parsed = await self._accept(text, than=self.mean_lp.get(best.draft.index),
                                                 truncated=finish == "length")
        if ok and (why := await self._refinement_error(ranked, text, parsed)):
            ok = False
        note = f"refined from {len(chosen)} draft(s) as {mode} (not as is: {not_as_is})"
        if ok:
            a = _Answer(text, t.AnswerSource.REFINED, True, parsed, chosen, mode, finish, note)
        else:
            a = self._draft_answer(best, mode, f"{note}; refinement rejected ({why}), best draft returned")
            a.chosen = chosen
            await self._replace_streamed(out, a.text, f"refinement rejected: {why}")
        a.ttft_ms, a.steps, a.generated = ttft, steps, steps
        return a

    async def _answer_alone(self, out: asyncio.Queue) -> _Answer:
        """No valid draft: the cloud answers itself, continuing from the steps the drafts got right
        before their first mistake (most common path first); its greedy answer is not held to the
        likelihood threshold (it is the target's most likely answer); when it fails a rule, a wrong
        computed value is corrected and the answer continued, then sampled candidates are checked."""
        p = self.cfg.policy
        verified = await asyncio.to_thread(lambda: [self._prefix_steps(j.draft.text) for j in self.judged.values()])
        prefix_steps = consensus_prefix([v for v in verified if v], 1)
        prefix = _join_steps(prefix_steps)
        text, ttft, steps, finish = await self._generate(self.prompt_text, prefix, p.refine_max_tokens, "cloud", out)
        valid, why, parsed = await self._accept(text, likelihood=False)
        a = _Answer(text, t.AnswerSource.CLOUD, valid, parsed, [],
                    t.RefineMode.PREFIX if prefix_steps else t.RefineMode.ALONE,  # a verified prefix is the drafts' work
                    finish, "", ttft, steps, steps)
        if not valid and p.calculator_fixes:
            why = await self._calculator_fixed(a, why, out)
        if not a.valid and p.cloud_candidates > 0:
            # candidates continue from the greedy answer's own steps before its first mistake (right
            # steps kept, fewer tokens decoded: select's candidates cost 0.6x)
            own = self.task.verified_prefix(self.spec, a.text)
            await self._candidates(a, _join_steps(own) if len(own) > len(prefix_steps) else prefix, why, out)
        a.note = ((f"no valid draft after retries: cloud answered alone from {len(prefix_steps)} verified steps"
                   if self.judged else "no drafts (cloud plan): the cloud answered alone")
                  + (f"; {a.note}" if a.note else "") + ("" if a.valid else " (its answer failed verification)"))
        return a

    def _prefix_steps(self, text: str) -> list[str]:
        """A draft's steps before its first mistake, and that step corrected where its mistake is a
        computed value (``Task.corrected_prefix``: the subset or operands stay the draft's). Tasks only:
        a word problem's draft carries its plan in prose, which nothing here checks."""
        ok = self.task.verified_prefix(self.spec, text)
        if self.task is OPEN or not self.cfg.policy.calculator_fixes:
            return ok
        fixed = self.task.corrected_prefix(self.spec, text)
        steps = split_steps(fixed) if fixed else []
        # the corrected step must be one the task verifies (arith: a step of the expression; a draft's
        # right arithmetic on the wrong terms, corrected, is still the wrong step: held-out prefix
        # answers fell from 0.96 to 0.71 right without this)
        if len(steps) == len(ok) + 1 and steps[: len(ok)] == ok and self.task.step_ok(self.spec, steps[-1]):
            return steps
        return ok

    async def _calculator_fixed(self, a: _Answer, why: str, out: asyncio.Queue) -> str:
        """The cloud's answer ``a`` failed the rules (``why``): where a computed value is wrong (an
        ``a op b = c``, a task step's sum), the true value replaces it (``Task.corrected_prefix``) and
        the target continues from there, up to ``calculator_fixes`` times; ``a`` is updated in place. Returns why the last answer still
        fails ('' when it passes)."""
        for n in range(self.cfg.policy.calculator_fixes):
            fixed = await asyncio.to_thread(self.task.corrected_prefix, self.spec, a.text)  # linear in the text
            if fixed is None:
                break
            await self._withdraw(out, f"the cloud's answer failed {why}: a computed value corrected")
            text, _, steps, finish = await self._generate(self.prompt_text, fixed, self._answer_budget, f"fix{n}", out)
            a.steps, a.generated = a.steps + steps, a.generated + steps
            a.valid, why, a.parsed = await self._accept(text, likelihood=False)
            a.text, a.finish = text, finish
            if a.valid:
                a.note = f"{n + 1} computed value(s) corrected"
                return ""
        return why

    async def _candidates(self, a: _Answer, prefix: str, why: str, out: asyncio.Queue) -> None:
        """Sample ``cloud_candidates`` answers in one batched request; each is checked as it finishes
        and the first that passes the rules replaces ``a``'s text, the others aborted (SmolLM2's haiku:
        one of 4 candidates looped to its 192-token budget while the other three ended by token 35)."""
        p = self.cfg.policy
        cands = self.engine.finished_samples(
            self.prompt_text + prefix,
            dataclasses.replace(self._params(p.refine_max_tokens), temperature=p.cloud_temperature, seed=None),
            p.cloud_candidates, f"{self.key}-cands")
        done, last = 0, 0
        async with contextlib.aclosing(cands):
            async for cand in cands:
                done, last = done + 1, cand.tokens
                a.generated += cand.tokens
                ok, _, parsed = await self._accept(prefix + cand.text, likelihood=False)
                if ok:
                    await self._replace_streamed(out, prefix + cand.text, f"the cloud's answer failed {why}; a candidate passed")
                    a.text, a.valid, a.parsed, a.finish = prefix + cand.text, True, parsed, _finish_reason(cand.finish_reason)
                    break
        # one batched request: its steps are the last finished candidate's tokens, and each candidate
        # aborted then had decoded as many (they advance in lockstep)
        a.steps += last
        a.generated += (p.cloud_candidates - done) * last

    async def _chunk(self, out: asyncio.Queue, text: str) -> None:
        self.shown += text
        await out.put(t.AnswerChunk(text))

    async def _withdraw(self, out: asyncio.Queue, reason: str) -> None:
        """Withdraw what was streamed (``AnswerReset``): the answer will be streamed anew."""
        if self.shown:
            self.shown = ""
            await out.put(t.AnswerReset(reason))

    async def _replace_streamed(self, out: asyncio.Queue, answer: str, reason: str) -> None:
        """The answer is not the text streamed: withdraw it (``AnswerReset``) and stream the answer,
        so that a client showing chunks as they come ends on the answer the Summary carries."""
        if self.shown == answer:
            return
        await self._withdraw(out, reason)
        await self._chunk(out, answer)

    def _summary(self, ranked: list[tuple[_Judged, float, float]], a: _Answer, timings: t.Timings) -> t.Summary:
        rank_of = {j.draft.index: r for j, r, _ in ranked}
        scores = [t.DraftScore(i, j.verdict.valid, j.verdict.score, rank_of.get(i, 0.0))
                  for i, j in sorted(self.judged.items())]
        trace = "; ".join(
            f"Draft#{j.draft.index} " + (f"scored {j.verdict.score:.2f}, passed {','.join(j.verdict.rules_passed)}"
                                         if j.verdict.valid else f"failed {j.verdict.failed_rule}: {j.verdict.error}")
            for j in self.judged.values()) + f" | {a.note}"
        return t.Summary(
            answer=a.text, source=a.source, chosen_drafts=[j.draft.index for j in a.chosen], scores=scores,
            timings=timings, trace=f"[THINKING_TRACE: {trace}]", answer_valid=a.valid,
            recommended_drafts=self.recommended_drafts, request_id=self.req.request_id, refine_mode=a.mode,
            fields=dict(a.parsed.fields) if a.parsed is not None and a.parsed.ok else {},
            prompt_tokens=self.engine.count_tokens(self.prompt_text), answer_tokens=self.engine.count_tokens(a.text),
            finish_reason=a.finish,
        )

    def _at_deadline(self) -> t.Summary | None:
        """The best answer the session has when its deadline expires mid-work (refinement, retries,
        candidates): the best verified draft, as is; None when no draft was verified valid. The
        deadline bounds the wait: an answer before it, never a better one after."""
        ranked = self._ranked()
        if not ranked:
            return None
        a = self._draft_answer(ranked[0][0], t.RefineMode.DEADLINE, "deadline reached: the best verified draft returned as is")
        return self._summary(ranked, a, t.Timings(total_ms=self._ms()))

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
                best = self._at_deadline()
                if best is not None:  # what was streamed of an unfinished refinement is not the answer
                    await self._replace_streamed(out, best.answer, "deadline: the best verified draft, as is")
                await out.put(best if best is not None else DeadlineExceeded(
                    f"deadline_ms: session exceeded its {self.deadline_s * 1e3:.0f} ms deadline with no verified draft"))
                if best is not None:
                    await out.put(_END)
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
