"""A stand-in target engine for unit tests of the session's parts: scripted logprobs and replies, and a
record of what it was asked (no model, no vLLM; the real engine is tested in test_service.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, PolicyConfig
from coinfer.cloud.context import SessionContext
from coinfer.cloud.engine import Chunk, EngineStats, GenParams, TargetEngine
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN, Task

LIKELIHOOD = {"verifier": "likelihood"}
"""The policy of the tests of the likelihood verifier's decisions (exact verification is the default: the
tests of exact split say so)."""

UNKNOWN_LOGPROBS = [-5.0] * 8
"""What the engine scores a continuation it has no entry for: far below any threshold."""

RIGHT = "Tom buys 3 * 4 = 12 apples.\nNow he has 5 + 12 = 17 apples.\nAnswer: 17"
WRONG = "Tom buys 3 * 4 = 12 apples.\nNow he has 4 + 12 = 16 apples.\nAnswer: 16"
"""Two drafts of ``apples()`` the arithmetic rule passes: the right answer, and a misread problem."""


def apples(refine: t.SamplingParams | None = None) -> t.OpenRequest:
    """An open word problem with the arithmetic rule and an ``Answer:`` marker to extract."""
    return t.OpenRequest(
        request_id="r",
        task="",
        prompt="Tom has 5 apples and buys 3 bags of 4. How many?",
        rules=[Rule("arithmetic")],
        refine=refine,
        extraction=Extraction("marker"),
    )


def apples_by_pattern(refine: t.SamplingParams | None = None) -> t.OpenRequest:
    """``apples()`` with its answer read by a pattern, not a marker: the cloud's own answer cannot stream checked
    step by step (``RuleSet.streams_steps``), so a draft not taken as is is refined from the drafts as candidates
    (``SessionContext.own_over_candidates`` does not hold), under the same arithmetic rule and the same fields."""
    return dataclasses.replace(apples(refine), extraction=Extraction("regex", r"Answer: (?P<answer>-?\d+)"))


class ScriptedEngine(TargetEngine):
    """Logprobs per continuation from a table; every generation answers ``reply``; the judge answers
    ``judged``. Counts what it did: ``generated`` tokens, ``scored`` continuations, and the request ids
    and prompts (and the generations' params) it was given."""

    def __init__(
        self,
        logprobs: dict[str, list[float]],
        reply: str,
        finish: str = "stop",
        delay_s: float = 0.0,
        judged: str = "",
    ) -> None:
        self.logprobs, self.reply, self.generated, self.finish = logprobs, reply, 0, finish
        self.delay_s = delay_s  # per generated word: a slow refinement
        self.judged = judged
        self.scored = 0
        self.request_ids: list[str] = []
        self.prompts: list[str] = []
        self.params: list[GenParams] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def generate(self, prompt: str, params: GenParams, request_id: str):
        self.request_ids.append(request_id)
        self.prompts.append(prompt)
        self.params.append(params)
        words = self.reply.split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(self.delay_s)
            self.generated += 1
            yield Chunk(word + (" " if i + 1 < len(words) else ""), 1, self.finish if i + 1 == len(words) else None)

    async def sample(self, prompt: str, params: GenParams, n: int, request_id: str) -> list[Chunk]:
        self.request_ids.append(request_id)
        self.prompts.append(prompt)
        self.generated += n
        return [Chunk(self.reply, 1) for _ in range(n)]

    async def continuation_logprobs(
        self, prompt: str, continuation: str, request_id: str, end: bool = True
    ) -> list[float]:
        self.scored += 1
        self.request_ids.append(request_id)
        return self.logprobs.get(continuation, UNKNOWN_LOGPROBS)

    async def judge(self, prompt: str, schema: dict, max_tokens: int, request_id: str) -> str:
        self.request_ids.append(request_id)
        return self.judged

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats(running=0, max_num_seqs=8, ready=True)

    @property
    def max_model_len(self) -> int:
        return 4096


class Replies(ScriptedEngine):
    """Answers each generation with the next of ``replies``."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__({}, reply="")
        self.replies = list(replies)

    async def generate(self, prompt: str, params: GenParams, request_id: str):
        self.reply = self.replies.pop(0)
        async for chunk in super().generate(prompt, params, request_id):
            yield chunk


def context(
    engine: TargetEngine,
    req: t.OpenRequest | None = None,
    task: Task = OPEN,
    spec: dict | None = None,
    rules: RuleSet | None = None,
    **policy,
) -> SessionContext:
    """A session's context on ``engine`` (``req``: an open request with no rules by default); ``policy``:
    PolicyConfig fields that differ from the defaults."""
    req = req or t.OpenRequest(request_id="r", task="", prompt="Explain why the sky is blue.")
    spec = {} if spec is None else spec
    rules = rules if rules is not None else RuleSet(req.rules, task, spec, extraction=req.extraction)
    cfg = CloudConfig(policy=PolicyConfig(**{**LIKELIHOOD, **policy}))
    return SessionContext(cfg=cfg, engine=engine, req=req, task=task, spec=spec, rules=rules)


def draft(index: int, text: str, *, own: float = -0.1, num_tokens: int = 12, truncated: bool = False) -> t.Draft:
    """A draft as the edge sends it (``own``: its model's mean logprob of it)."""
    return t.Draft(index=index, text=text, num_tokens=num_tokens, mean_logprob=own, edge_ms=1.0, truncated=truncated)


class GreedyWords(ScriptedEngine):
    """A token-level stand-in for a greedy target (``coinfer.cloud.speculation``): tokens are words, and the
    target's argmax after any token sequence follows ``answer`` where the answer so far is a prefix of it, else
    ends the turn (``END``). ``checks``: the (ids, start) of every exact check; ``decoded``: tokens generated."""

    END = 0
    speculative = True

    def __init__(self, answer: str, prompt_words: int = 3) -> None:
        super().__init__({}, reply=answer)
        self.vocab: dict[str, int] = {"<end>": self.END}
        self.answer = [self._id(w) for w in answer.split(" ")]
        self.end_id, self.stop_ids = self.END, frozenset()
        self.checks: list[tuple[list[int], int]] = []
        self.decoded = 0
        self.prompt_words = prompt_words
        self.leads: dict[int, float] = {}
        """The argmax's lead over the runner-up (nats) at answer positions that are near-ties (others: 10)."""

    def _id(self, word: str) -> int:
        return self.vocab.setdefault(word, len(self.vocab))

    def word(self, i: int) -> str:
        return next(w for w, j in self.vocab.items() if j == i)

    def argmax(self, answer_so_far: list[int]) -> int:
        k = len(answer_so_far)
        return self.answer[k] if answer_so_far == self.answer[:k] and k < len(self.answer) else self.END

    async def prompt_ids(self, prompt: str) -> list[int]:
        return [self._id(w) for w in prompt.split(" ")][: self.prompt_words]

    async def text_ids(self, text: str) -> list[int]:
        return [self._id(w) for w in text.strip().split(" ") if w]

    async def top_tokens(self, ids: list[int], start: int, request_id: str) -> list[int]:
        self.checks.append((list(ids), start))
        self.request_ids.append(request_id)
        n = self.prompt_words
        top = [self.argmax(ids[n:p]) for p in range(start, len(ids) + 1)]
        return top, [self.leads.get(p - n, 10.0) for p in range(start, len(ids) + 1)]

    def next_token(self, ids: list[int], params: GenParams, rng: random.Random) -> int:
        """The token a generation writes after ``ids`` (prompt included): the argmax."""
        return self.argmax(ids[self.prompt_words :])

    async def generate_ids(self, ids: list[int], params: GenParams, request_id: str):
        self.request_ids.append(request_id)
        rng, ans = random.Random(f"{params.seed}-{len(ids)}-g"), list(ids)
        for i in range(params.max_tokens):
            tok = self.next_token(ans, params, rng)
            ans.append(tok)
            self.decoded += 1
            last = tok == self.END or i + 1 == params.max_tokens
            yield Chunk(
                "" if tok == self.END else " " + self.word(tok),
                1,
                ("stop" if tok == self.END else "length") if last else None,
            )
            if last:
                return

    async def generate(self, prompt: str, params: GenParams, request_id: str):
        async for c in self.generate_ids(await self.prompt_ids(prompt), params, request_id):
            yield c

    def decoder(self, ids: list[int]):
        engine = self

        class Words:
            def step(self, token: int) -> str | None:
                return "" if token == engine.END else " " + engine.word(token)

        return Words()


class SampledWords(GreedyWords):
    """A token-level stand-in for a sampled target: a Markov chain over ``CHAIN``'s words (each token's
    distribution depends on the token before it), sampled at the request's temperature. ``token_rows`` gives the
    raw rows a prefill would; ``sample_token`` and ``generate_ids`` sample from the chain, seeded by the
    request's seed (so that a test's runs are the same on every machine)."""

    CHAIN = {
        None: {"a": 0.5, "b": 0.3, "c": 0.15, "<end>": 0.05},
        "a": {"a": 0.1, "b": 0.6, "c": 0.2, "<end>": 0.1},
        "b": {"a": 0.3, "b": 0.1, "c": 0.4, "<end>": 0.2},
        "c": {"a": 0.25, "b": 0.25, "c": 0.2, "<end>": 0.3},
    }

    def __init__(self) -> None:
        super().__init__("a b c")
        for w in ("a", "b", "c"):
            self._id(w)
        self.vocab_size = len(self.vocab)
        self.sampled = 0

    def dist(self, ids: list[int], temperature: float = 1.0) -> dict[int, float]:
        """The chain's distribution after ``ids`` (the answer's last token decides) at ``temperature``."""
        last = self.word(ids[-1]) if len(ids) > self.prompt_words else None
        raw = {self.vocab[w]: p ** (1.0 / temperature) for w, p in self.CHAIN[last].items()}
        z = sum(raw.values())
        return {tok: p / z for tok, p in raw.items()}

    async def token_rows(self, ids: list[int], start: int, request_id: str, k: int):
        from coinfer.cloud.sampled import Row

        self.checks.append((list(ids), start))
        rows = []
        for pos in range(start, len(ids)):
            d = self.dist(ids[:pos])
            top = sorted(d.items(), key=lambda kv: -kv[1])[:k]
            rows.append(
                Row(own=math.log(d[ids[pos]]), top=tuple(math.log(p) for _, p in top), own_in_top=ids[pos] in dict(top))
            )
        return rows

    def _draw(self, ids: list[int], params: GenParams, rng: random.Random, refused: int | None = None) -> int:
        d = dict(self.dist(ids, params.temperature))
        d.pop(refused, None)
        toks = sorted(d)
        return rng.choices(toks, weights=[d[t] for t in toks])[0]

    async def sample_token(self, ids: list[int], params: GenParams, request_id: str, refused: int | None):
        self.sampled += 1
        return self._draw(ids, params, random.Random(f"{params.seed}-{len(ids)}-t"), refused)

    def next_token(self, ids: list[int], params: GenParams, rng: random.Random) -> int:
        return self._draw(ids, params, rng)


class TakingWords(GreedyWords):
    """``GreedyWords`` that takes drafts inside its generation, as vLLM does with coinfer's proposer
    (``coinfer.cloud.draft_proposer``): each step proposes up to ``k`` tokens (``Lookup``), takes those equal to its
    argmax and writes its own next one; ``add_drafts`` reaches the generation under way. ``added``: what was sent;
    ``steps``: the steps taken; ``step_s``: (virtual) seconds a step."""

    takes_drafts = True

    def __init__(self, answer: str, k: int = 4, step_s: float = 0.0) -> None:
        super().__init__(answer)
        self.k, self.added, self.steps, self.step_s = k, [], 0, step_s
        self._lookups: dict[str, object] = {}
        self._refused: dict[str, int] = {}

    async def drafts_refused(self, request_id: str) -> int:
        return self._refused.pop(request_id, 0)

    async def add_drafts(self, request_id: str, drafts) -> None:
        self.added.append([list(d) for d in drafts])
        if request_id in self._lookups:
            self._lookups[request_id].add(drafts)

    async def generate_ids(self, ids: list[int], params: GenParams, request_id: str, drafts=None):
        from coinfer.cloud.draft_proposer import Lookup

        self.request_ids.append(request_id)
        look = self._lookups[request_id] = Lookup(list(drafts or []))
        n, out, offered = len(ids), list(ids), 0
        while True:
            await asyncio.sleep(self.step_s)  # a step: sends from other tasks land between steps
            self.steps += 1
            proposal = look.propose(out[n:], self.k) if len(out) > n else []
            offered += len(proposal)
            step = []
            for tok in proposal:
                if tok != self.argmax(out[n:]):
                    break
                out.append(tok)
                step.append(tok)
                if tok == self.END:
                    break
            self._refused[request_id] = self._refused.get(request_id, 0) + len(proposal) - len(step)
            if not step or step[-1] != self.END:
                out.append(self.argmax(out[n:]))
                step.append(out[-1])
            for i, tok in enumerate(step):
                written = len(out) - n - (len(step) - 1 - i)
                end = tok == self.END or written >= params.max_tokens
                text = "" if tok == self.END else " " + self.word(tok)
                yield Chunk(
                    text,
                    1,
                    ("stop" if tok == self.END else "length") if end else None,
                    accepted=int(i < len(step) - 1),
                    offered=offered if end else 0,
                )
                if end:
                    return
