"""How a session answers once its drafts are judged: the best verified draft as is (or continued where
it was cut at the draft budget), a refinement of the drafts (a verified prefix continued, or the best
drafts as candidates), or, with no valid draft, the cloud alone (corrected computed values, then
sampled candidates); each answer re-checked before it replaces the drafts (docs/design.md §2.2).

A mixin of ``coinfer.cloud.session.Session`` (its state; its stream: ``_chunk``, ``_withdraw``,
``_replace_streamed``).

Each chunk says whether the answer streamed so far is final (``AnswerChunk.final``): it is when every
answer the session can still end on begins with it. A draft accepted as is is final; a continuation or
a prefix refinement is final while it writes what its fallback (the best draft) says, since a rejection
returns that draft; the cloud's own answer is final where nothing but the loop watch can refuse it
(``RuleSet.only_loop_watch``), and is then kept whatever follows (no correction, no candidates: they
would withdraw it). Everything else is held by a client that cannot take text back (docs/api.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from coinfer import types as t
from coinfer.chat import refine_question, with_question
from coinfer.cloud.engine import GenParams
from coinfer.cloud.policy import consensus_prefix, mean_logprob, refine_max_tokens
from coinfer.cloud.session_state import Judged, Ranked, SessionState
from coinfer.repetition import FINISH_REASON as LOOP
from coinfer.repetition import repetition_error
from coinfer.tasks import OPEN, Parsed
from coinfer.tasks.base import split_steps

LOOP_CHECK_TOKENS = 16
"""How often (in generated tokens) the cloud's own generation is checked for a loop."""


def _never(text: str) -> bool:
    return False


def _always(text: str) -> bool:
    return True


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
            return stripped[len(label) :]
    return text


@dataclass
class Answer:
    """How the session answered: what the Summary reports (cloud work in ``steps`` decode steps and
    ``generated`` tokens, a batch of candidates counting each)."""

    text: str
    source: t.AnswerSource
    valid: bool
    parsed: Parsed | None
    chosen: list[Judged]
    mode: str
    finish: str
    note: str
    ttft_ms: float = 0.0
    steps: int = 0
    generated: int = 0


class Answering(SessionState):
    """The answer paths and the checks an answer passes (the stream: ``Session``'s)."""

    def _params(self, max_tokens: int) -> GenParams:
        """The request's sampling (temperature, top_p, penalties, seed, stop), else the policy's."""
        sp = self.req.refine
        if sp is None:
            return GenParams(max_tokens=max_tokens, temperature=self.cfg.policy.refine_temperature)
        return GenParams(
            max_tokens=min(max_tokens, sp.max_new_tokens),
            temperature=sp.temperature,
            top_p=sp.top_p,
            presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty,
            seed=sp.seed,
            stop=sp.stop,
        )

    async def _generate(
        self,
        prompt: str,
        prefix: str,
        max_tokens: int,
        tag: str,
        out: asyncio.Queue,
        final: Callable[[str], bool] = _never,
    ) -> tuple[str, float, int, str]:
        """Stream the target's answer to ``prompt`` after ``prefix``, each chunk final when ``final``
        holds for the text so far; returns (text, TTFT ms, tokens, finish reason: "stop", "length" or
        "repetition"). A generation that falls into a loop is stopped there (checked every
        ``LOOP_CHECK_TOKENS``): the rules would refuse it anyway, and SmolLM2's looping greedy haiku
        otherwise ran to its 192-token budget before candidates began."""
        t_start, ttft = time.perf_counter(), 0.0
        if prefix:
            await self._chunk(out, prefix, final(prefix))
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
                    await self._chunk(out, delta.text, final(text))
                if tokens - checked >= LOOP_CHECK_TOKENS and delta.finish_reason is None:
                    checked = tokens
                    if repetition_error(text):  # linear in the text, which is bounded by max_tokens
                        finish = LOOP
                        break
        return text, ttft, tokens, finish

    async def _accept(
        self, text: str, likelihood: bool = True, than: float | None = None, truncated: bool = False
    ) -> tuple[bool, str, Parsed]:
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

    def _consensus(self, ranked: Ranked) -> object | None:
        """The answer every verified draft gives, when >= 2 drafts (duplicates count) give it; else None."""
        keys = {self._agreement_key(j.draft.text, j.parsed) for j, _, _ in ranked}
        return keys.pop() if len(keys) == 1 and sum(j.support for j, _, _ in ranked) >= 2 else None

    async def _refinement_error(self, ranked: Ranked, text: str, parsed: Parsed) -> str:
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
            return (
                f"contradicts: the drafts agree and the target prefers them (refinement mean logprob "
                f"{mean:.2f} < {floor:.2f} per token)"
            )
        return "contradicts: the drafts agree on another answer"

    def _accept_as_is(self, ranked: Ranked) -> str:
        """The best verified draft is the answer as it stands: the target finds it likely (mean and
        least likely token) and the drafts agree on its answer. Refining it would spend cloud decode
        tokens to write what the draft already says. Returns "" to accept, else why not (the trace).
        Where the rules decide, a draft that passed them is right: accepted."""
        if self.rules_decide:
            return ""
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

    def _accept_free_text(self, best: Judged, min_lp: float) -> str:
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

    def _refine_plan(self, ranked: Ranked) -> tuple[str, str, str, list[Judged]]:
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
        question = refine_question(
            self.req.question, [j.draft.text for j in chosen], p.refine_template, p.candidate_format
        )
        return t.RefineMode.CANDIDATES, self.engine.render(with_question(conv, question)), "", chosen

    @staticmethod
    def _draft_answer(best: Judged, mode: str, note: str) -> Answer:
        return Answer(
            best.draft.text,
            t.AnswerSource.DRAFT,
            True,
            best.parsed,
            [best],
            mode,
            "length" if best.draft.truncated else "stop",
            note,
        )

    async def _answer_as_is(self, ranked: Ranked, out: asyncio.Queue) -> Answer:
        best, _, agree = ranked[0]
        await self._chunk(out, best.draft.text, final=True)
        return self._draft_answer(
            best,
            t.RefineMode.ACCEPTED,
            f"best draft accepted as is (score {best.verdict.score:.2f}, agreement {agree:.2f})",
        )

    @property
    def _answer_budget(self) -> int:
        """The tokens this request gives the cloud's answer: the policy's, or less when the request asks."""
        return self._params(self.cfg.policy.refine_max_tokens).max_tokens

    def _cut_short(self, best: Judged) -> bool:
        """The best draft stopped at the edge's draft budget, shorter than the answer budget this request
        gives the cloud (drafts: 256 tokens by default, the cloud's answer 512): taken as is, the answer
        would end where the target's own would not. Not where the rules decide: the draft passed checkers
        that grade a whole answer, so it is one."""
        return not self.rules_decide and best.draft.truncated and self._answer_budget > best.draft.num_tokens

    async def _answer_continued(self, ranked: Ranked, out: asyncio.Queue) -> Answer:
        """A draft good enough to take as is but cut at the draft budget: the target continues it to the
        answer's own budget (the draft is the verified prefix; only the rest is decoded). A continuation
        that fails the rules (a loop) is dropped: the draft as it stands."""
        best, _, agree = ranked[0]
        # the draft is final (a failed continuation returns it), its continuation is held
        text, ttft, steps, finish = await self._generate(
            self.prompt_text,
            best.draft.text,
            self._answer_budget - best.draft.num_tokens,
            "c",
            out,
            final=best.draft.text.startswith,
        )
        ok, why, parsed = await self._accept(text, likelihood=False)
        note = (
            f"best draft accepted as is (score {best.verdict.score:.2f}, agreement {agree:.2f}), "
            f"cut at its {best.draft.num_tokens}-token budget: continued by the target"
        )
        if ok:
            a = Answer(text, t.AnswerSource.REFINED, True, parsed, [best], t.RefineMode.PREFIX, finish, note)
        else:
            a = self._draft_answer(
                best, t.RefineMode.ACCEPTED, f"{note}; the continuation failed ({why}), draft returned"
            )
            await self._replace_streamed(out, a.text, f"continuation rejected: {why}")
        a.ttft_ms, a.steps, a.generated = ttft, steps, steps
        return a

    async def _answer_refined(self, ranked: Ranked, not_as_is: str, out: asyncio.Queue) -> Answer:
        """The target refines the drafts (a verified prefix continued, or candidates in the prompt); a
        refinement that fails the rules, leaks the template, is unlikely or contradicts what the drafts
        agree on is withdrawn and the best draft returned: never worse than the best valid draft."""
        p = self.cfg.policy
        best = ranked[0][0]
        mode, prompt, prefix, chosen = self._refine_plan(ranked)
        # latency-aware budget (docs/design.md §4.4), but never shorter than twice the longest draft used
        max_tokens = max(
            refine_max_tokens(best.verdict.score, p.refine_max_tokens),
            min(p.refine_max_tokens, 2 * max(j.draft.num_tokens for j in chosen) + 16),
        )
        # final while it writes what the best draft says (a rejection returns that draft); a candidates
        # refinement may lose a leading label once done, so none of it is final before then
        same = best.draft.text.startswith if mode is t.RefineMode.PREFIX else _never
        text, ttft, steps, finish = await self._generate(prompt, prefix, max_tokens, f"r{self.attempt}", out, same)
        if mode is t.RefineMode.CANDIDATES:
            text = _strip_candidate_label(text, p.candidate_format, len(chosen))
        if why := _scaffolding_error(text, p.refine_template):
            ok, parsed = False, None
        else:
            ok, why, parsed = await self._accept(
                text, than=self.mean_lp.get(best.draft.index), truncated=finish != "stop"
            )
        if ok and (why := await self._refinement_error(ranked, text, parsed)):
            ok = False
        note = f"refined from {len(chosen)} draft(s) as {mode} (not as is: {not_as_is})"
        if ok:
            a = Answer(text, t.AnswerSource.REFINED, True, parsed, chosen, mode, finish, note)
        else:
            a = self._draft_answer(best, mode, f"{note}; refinement rejected ({why}), best draft returned")
            a.chosen = chosen
            await self._replace_streamed(out, a.text, f"refinement rejected: {why}")
        a.ttft_ms, a.steps, a.generated = ttft, steps, steps
        return a

    async def _answer_alone(self, out: asyncio.Queue) -> Answer:
        """No valid draft: the cloud answers itself, continuing from the steps the drafts got right
        before their first mistake (most common path first); its greedy answer is not held to the
        likelihood threshold (it is the target's most likely answer); when it fails a rule, a wrong
        computed value is corrected and the answer continued, then sampled candidates are checked."""
        p = self.cfg.policy
        verified = await asyncio.to_thread(lambda: [self._prefix_steps(j.draft.text) for j in self.judged.values()])
        prefix_steps = consensus_prefix([v for v in verified if v], 1)
        prefix = _join_steps(prefix_steps)
        # only the loop watch can refuse it: it streams as final and is kept (a loop is cut, not replaced)
        commit = self.rules.only_loop_watch
        text, ttft, steps, finish = await self._generate(
            self.prompt_text, prefix, p.refine_max_tokens, "cloud", out, _always if commit else _never
        )
        valid, why, parsed = await self._accept(text, likelihood=False)
        a = Answer(
            text,
            t.AnswerSource.CLOUD,
            valid,
            parsed,
            [],
            t.RefineMode.PREFIX if prefix_steps else t.RefineMode.ALONE,  # a verified prefix is the drafts' work
            finish,
            "streamed as final: a loop cut" if finish == LOOP and commit else "",
            ttft,
            steps,
            steps,
        )
        if not valid and p.calculator_fixes and not commit:
            why = await self._calculator_fixed(a, why, out)
        if not a.valid and p.cloud_candidates > 0 and not commit:
            # candidates continue from the greedy answer's own steps before its first mistake (right
            # steps kept, fewer tokens decoded: select's candidates cost 0.6x)
            own = self.task.verified_prefix(self.spec, a.text)
            await self._candidates(a, _join_steps(own) if len(own) > len(prefix_steps) else prefix, why, out)
        a.note = (
            (
                f"no valid draft after retries: cloud answered alone from {len(prefix_steps)} verified steps"
                if self.judged
                else "no drafts (cloud plan): the cloud answered alone"
            )
            + (f"; {a.note}" if a.note else "")
            + ("" if a.valid else " (its answer failed verification)")
        )
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

    async def _calculator_fixed(self, a: Answer, why: str, out: asyncio.Queue) -> str:
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

    async def _candidates(self, a: Answer, prefix: str, why: str, out: asyncio.Queue) -> None:
        """Sample ``cloud_candidates`` answers in one batched request; each is checked as it finishes
        and the first that passes the rules replaces ``a``'s text, the others aborted (SmolLM2's haiku:
        one of 4 candidates looped to its 192-token budget while the other three ended by token 35)."""
        p = self.cfg.policy
        cands = self.engine.finished_samples(
            self.prompt_text + prefix,
            dataclasses.replace(self._params(p.refine_max_tokens), temperature=p.cloud_temperature, seed=None),
            p.cloud_candidates,
            f"{self.key}-cands",
        )
        done, last = 0, 0
        async with contextlib.aclosing(cands):
            async for cand in cands:
                done, last = done + 1, cand.tokens
                a.generated += cand.tokens
                ok, _, parsed = await self._accept(prefix + cand.text, likelihood=False)
                if ok:
                    await self._replace_streamed(
                        out, prefix + cand.text, f"the cloud's answer failed {why}; a candidate passed"
                    )
                    a.text, a.valid, a.parsed, a.finish = (
                        prefix + cand.text,
                        True,
                        parsed,
                        _finish_reason(cand.finish_reason),
                    )
                    break
        # one batched request: its steps are the last finished candidate's tokens, and each candidate
        # aborted then had decoded as many (they advance in lockstep)
        a.steps += last
        a.generated += (p.cloud_candidates - done) * last
