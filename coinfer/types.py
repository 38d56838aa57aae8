"""Domain types both sides exchange; ``coinfer.convert`` maps them to and from coinfer.v1.

Field names equal the protobuf field names so that one generic converter serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from coinfer.chat import ChatMessage, conversation, question_of
from coinfer.errors import require
from coinfer.extract import Extraction
from coinfer.repetition import FINISH_REASON as LOOP_FINISH_REASON
from coinfer.rulespec import Rule
from coinfer.validate import MAX_NEW_TOKENS


class Plan(StrEnum):
    """Where a request runs: the edge alone, drafts on the edge verified and refined by the cloud,
    or the cloud alone. What a request or config may ask for adds ``auto`` (``coinfer.edge.kinds.RequestedPlan``)."""

    EDGE = "edge"
    SPLIT = "split"
    CLOUD = "cloud"


class RefineMode(StrEnum):
    """How the cloud built its answer from the drafts (``Summary.refine_mode``)."""

    ACCEPTED = "accepted"
    """The best verified draft, as it stands (no refinement)."""
    PREFIX = "prefix"
    """The target continued a verified step prefix of the drafts."""
    CANDIDATES = "candidates"
    """The target refined from the best verified drafts in its prompt."""
    ALONE = "alone"
    """No usable draft: the target answered by itself."""
    DEADLINE = "deadline"
    """The deadline expired mid-work: the best verified draft, as is."""
    EXACT = "exact"
    """The target's own answer, written taking the drafts' tokens where they are the ones it writes itself
    (exact verification: ``coinfer.cloud.speculation``)."""
    REPAIRED = "repaired"
    """The best verified draft with its computed values rewritten to their true values by the cloud's
    calculator (``Task.repaired``), as it then stands: the rules passed it repaired (``Verdict.repaired``)."""


FROM_DRAFTS = frozenset(
    {RefineMode.ACCEPTED, RefineMode.REPAIRED, RefineMode.PREFIX, RefineMode.CANDIDATES, RefineMode.EXACT}
)
"""Refine modes whose answer is built from the drafts."""


class ModelState(StrEnum):
    """The edge model's state (the planner's cold-start term)."""

    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


class BreakerState(StrEnum):
    """The edge's circuit breaker in front of the cloud."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class ResultSource(StrEnum):
    """Where an edge answer came from (``SolveResult.source``, the HTTP ``coinfer.source``)."""

    REFINED = "refined"
    """The cloud refined the drafts."""
    DRAFT = "draft"
    """A verified draft, as the cloud accepted it."""
    CLOUD = "cloud"
    """The cloud answered alone (the cloud plan, or no usable draft)."""
    EDGE_ONLY = "edge_only"
    """The edge answered alone: the edge plan, or the local fallback when the cloud failed."""

    @classmethod
    def of(cls, source: int) -> ResultSource:
        """The edge's name for the cloud's ``AnswerSource``; one it does not name (0: unset, or a newer
        cloud's) is the cloud's answer."""
        return {AnswerSource.REFINED: cls.REFINED, AnswerSource.DRAFT: cls.DRAFT}.get(source, cls.CLOUD)


class VerifierKind(StrEnum):
    """How the cloud judges an open request's drafts after the rules (``PolicyConfig.verifier``)."""

    EXACT = "exact"
    """The answer is the target's own: it takes a draft's tokens only where they are the ones it would write
    (docs/api.md, "Exact split"). The default."""
    LIKELIHOOD = "likelihood"
    """May change the answer: a whole draft the target finds likely enough is the answer, as the draft model
    wrote it."""
    JUDGE = "judge"
    """May change the answer: the target, asked as a judge, passes a draft as the answer."""


class FinishReason(StrEnum):
    """Why an answer ended (``Summary.finish_reason``, OpenAI's ``finish_reason``)."""

    STOP = "stop"
    """The model ended it (end of turn, a stop string)."""
    LENGTH = "length"
    """It hit its token budget: incomplete."""
    REPETITION = LOOP_FINISH_REASON
    """The cloud stopped its own generation where it fell into a loop (``coinfer.repetition``)."""


def speculation_kind(*, temperature: float, top_p: float, presence_penalty: float, frequency_penalty: float) -> str:
    """How a generation with this sampling can take draft tokens and stay the target's own
    (``coinfer.cloud.speculation``): "greedy" (temperature 0: the tokens equal to the target's argmax), "sampled"
    (over the whole vocabulary, ``top_p`` 1: each token with the target's probability of it), "" (penalties or a
    nucleus: the engine's own generation). The one rule the edge (a greedy first draft) and the cloud follow."""
    if presence_penalty != 0 or frequency_penalty != 0:
        return ""
    if temperature == 0:
        return "greedy"
    return "sampled" if top_p == 1.0 else ""


@dataclass(kw_only=True, frozen=True)
class SamplingParams:
    """Sampling for a generation. Defaults are the seed's draft defaults (003, 4.2)."""

    temperature: float = 0.3
    """0 means greedy; range [0, 2]."""
    top_p: float = 0.95
    """Nucleus mass, (0, 1]."""
    presence_penalty: float = 0.2
    """Subtracted once from a token's logit if it appeared; [-2, 2]."""
    frequency_penalty: float = 0.1
    """Subtracted per occurrence; [-2, 2]."""
    max_new_tokens: int = 256
    """New-token budget, 1..limit."""
    seed: int | None = None
    """Seed for reproducible sampling; None = unseeded."""
    stop: tuple[str, ...] = ()
    """Stop strings: the text ends before the first one (EOS always stops)."""

    @property
    def argmax(self) -> bool:
        """Greedy and unpenalised: the model's most likely token at every step."""
        return self.temperature == 0 and self.presence_penalty == 0 and self.frequency_penalty == 0

    @property
    def speculable(self) -> bool:
        """A generation whose target can take draft tokens and stay its own (``coinfer.cloud.speculation``):
        greedy, or sampled over the whole vocabulary (``top_p`` 1), unpenalised."""
        return bool(
            speculation_kind(
                temperature=self.temperature,
                top_p=self.top_p,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
            )
        )

    def validate(self, field: str, max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        require(0.0 <= self.temperature <= 2.0, f"{field}.temperature", f"must be in [0, 2], got {self.temperature:g}")
        require(0.0 < self.top_p <= 1.0, f"{field}.top_p", f"must be in (0, 1], got {self.top_p:g}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            require(-2.0 <= v <= 2.0, f"{field}.{name}", f"must be in [-2, 2], got {v:g}")
        require(
            1 <= self.max_new_tokens <= max_new_tokens,
            f"{field}.max_new_tokens",
            f"must be in 1..{max_new_tokens}, got {self.max_new_tokens}",
        )
        require(stops_ok(self.stop), f"{field}.stop", STOPS_RULE)


MAX_STOPS, MAX_STOP_CHARS = 8, 64
STOPS_RULE = f"at most {MAX_STOPS} strings of 1..{MAX_STOP_CHARS} chars"


def stops_ok(stop: tuple[str, ...] | list[str]) -> bool:
    """Whether ``stop`` keeps ``STOPS_RULE`` (the gRPC API's and the HTTP API's one bound)."""
    return len(stop) <= MAX_STOPS and all(isinstance(x, str) and 0 < len(x) <= MAX_STOP_CHARS for x in stop)


@dataclass(kw_only=True)
class OpenRequest:
    """The first message of a session."""

    request_id: str
    task: str
    """A built-in task preset, or "" for an open request."""
    prompt: str
    """The question as one user turn ("" when ``messages`` carries the conversation)."""
    rules: list[Rule] = field(default_factory=list)
    refine: SamplingParams | None = None
    """None = the server's refinement defaults."""
    expected_drafts: int = 0
    deadline_ms: int = 0
    messages: list[ChatMessage] = field(default_factory=list)
    """The conversation; empty = ``prompt`` as one user turn."""
    extraction: Extraction = field(default_factory=Extraction)
    draft_model: str = ""
    """The edge's draft model identity (its manifest's digest; "" from older edges and the cloud plan):
    what the cloud's round odds are kept by (``coinfer.cloud.rounds.request_kind``)."""
    drafts_on_request: bool = False
    """The edge drafts continuations of the answer when the cloud asks (``DraftFrom``); False from an older edge."""

    @property
    def conversation(self) -> list[ChatMessage]:
        return conversation(self.prompt, self.messages)

    @property
    def question(self) -> str:
        """The last user turn: what a task preset parses."""
        return question_of(self.conversation)


@dataclass(kw_only=True)
class Draft:
    index: int
    text: str
    num_tokens: int = 0
    mean_logprob: float = 0.0
    edge_ms: float = 0.0
    truncated: bool = False
    """It hit its token budget before ending (an incomplete answer)."""
    greedy: bool = False
    """Written greedily, unpenalised: the draft model's argmax at every token (the draft an exact check of a
    greedy answer takes most of: ``coinfer.cloud.speculation``)."""
    continues: int = 0
    """The ``DraftFrom`` round it answers (its text begins with that text); 0: one of the session's own rounds."""


@dataclass(kw_only=True)
class Verdict:
    draft_index: int
    valid: bool
    score: float = 0.0
    error: str = ""
    failed_rule: str = ""
    verify_ms: float = 0.0
    rules_passed: list[str] = field(default_factory=list)
    duplicate_of: int = 0
    """Index + 1 of the draft this one duplicates (0 = none)."""
    repaired: str = ""
    """Why the draft as written failed the rules, where it passed them once the cloud's calculator rewrote
    its computed values (``Task.repaired``); "" : it was judged as written."""


@dataclass
class AnswerChunk:
    text: str
    final: bool = False
    """The answer streamed so far, this chunk included, begins every answer the session can still end
    on: it may leave where text cannot be taken back (an OpenAI stream). False: it may be withdrawn."""


@dataclass
class AnswerReset:
    """The answer streamed so far is withdrawn; what follows is the answer: the cloud rejected the
    text it streamed (verification), or its replica failed mid-answer and the session was replayed
    on another, which streams its own."""

    reason: str


class AnswerSource(IntEnum):
    UNSPECIFIED = 0
    REFINED = 1
    DRAFT = 2
    CLOUD = 3


@dataclass(kw_only=True)
class DraftScore:
    draft_index: int
    valid: bool
    score: float
    rank_score: float


@dataclass(kw_only=True)
class Timings:
    verify_ms: float = 0.0
    refine_ttft_ms: float = 0.0
    refine_ms: float = 0.0
    total_ms: float = 0.0
    decode_steps: int = 0
    """Target decode steps on the refinement's critical path (streamed + longest candidate)."""
    decode_tokens: int = 0
    """Every target token generated for the answer (streamed + all fallback candidates)."""


@dataclass(kw_only=True)
class CloudCost:
    """What one session made the cloud's engine do, counted where every engine request passes
    (``VllmEngine._run``): the cloud's own cost of an answer, which the edge's planner estimates per plan
    and task and ``--explain`` reports (``cloud_tokens``). Counts, not seconds: the engine batches many
    sessions into each step, so a session's wall time in it is not its share of the machine, while the
    tokens it computed are."""

    engine_requests: int = 0
    """vLLM requests: verification scoring, the judge, refinement, candidates (each a scheduling cost)."""
    prompt_tokens: int = 0
    """Prompt tokens of those requests, prefix-cache hits included."""
    cached_tokens: int = 0
    """Of ``prompt_tokens``, those read from vLLM's prefix cache instead of computed."""
    decoded_tokens: int = 0
    """Every token the engine generated for the session (all samples of a batched request)."""
    scored_tokens: int = 0
    """Of the prompt tokens computed (past the cache), those of requests that score a text (a draft's
    likelihood, an exact check of its tokens): prefill work done to judge, not to answer."""
    steps: int = 0
    """Sequential engine steps the session's requests took: per request its prefill (1) and the decode
    steps of its longest sample (a batch of samples advances in lockstep)."""
    draft_tokens_offered: int = 0
    """Draft tokens (in the target's tokens) the target checked exactly (``coinfer.cloud.speculation``)."""
    draft_tokens_accepted: int = 0
    """Of those, the ones it took: the tokens it would have written itself there."""

    @property
    def work_tokens(self) -> int:
        """Tokens the engine computed: prefill past the cache, plus decoding."""
        return self.prompt_tokens - self.cached_tokens + self.decoded_tokens

    def add_request(
        self, *, prompt: int, cached: int, decoded: int, longest: int, scored: bool, steps: int = 0
    ) -> None:
        """Fold one engine request into the count: its prompt, prefix-cache hits, generated tokens (all
        samples), its longest sample's tokens, and whether it scored a text (``scored_tokens``); ``steps``:
        its engine steps where counted (a generation taking drafts inside the engine writes several tokens a
        step), else one per token of its longest sample."""
        self.engine_requests += 1
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.decoded_tokens += decoded
        self.steps += steps or 1 + max(0, longest - 1)  # the prefill writes the first token
        if scored:
            self.scored_tokens += prompt - cached


@dataclass(kw_only=True)
class RequestTally:
    """One engine request counted as its outputs arrive, then folded into the session's ``CloudCost``: the
    in-process and the remote engine count the same way."""

    prompt: int
    scored: bool
    stepwise: bool = False
    """Each output is one engine step (a generation taking drafts inside the engine, one output a step)."""
    cached: int = 0
    per_sample: dict[int, int] = field(default_factory=dict)
    seen: bool = False
    outputs: int = 0

    def output(self, cached: int, samples: list[tuple[int, int]], *, delta: bool = True) -> None:
        """An output: its prefix-cache hits and, per sample index, its tokens (new ones if ``delta``, else
        the sample's total so far)."""
        self.seen = True
        self.outputs += 1
        self.cached = max(self.cached, cached)
        for index, n in samples:
            self.per_sample[index] = (self.per_sample.get(index, 0) if delta else 0) + n

    def charge(self, cost: CloudCost | None) -> None:
        """Fold into ``cost``, once anything came back: aborted requests too, what they computed was spent."""
        if self.seen and cost is not None:
            cost.add_request(
                prompt=self.prompt,
                cached=self.cached,
                decoded=sum(self.per_sample.values()),
                longest=max(self.per_sample.values(), default=0),
                scored=self.scored,
                steps=self.outputs if self.stepwise else 0,
            )


@dataclass(kw_only=True)
class Summary:
    answer: str
    source: AnswerSource
    chosen_drafts: list[int] = field(default_factory=list)
    scores: list[DraftScore] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    trace: str = ""
    answer_valid: bool = False
    recommended_drafts: int = 0
    request_id: str = ""
    refine_mode: RefineMode | None = None
    """How the cloud used the drafts (accepted, prefix, candidates, alone, deadline); None: not said."""
    fields: dict = field(default_factory=dict)
    """Fields extracted from the final answer."""
    prompt_tokens: int = 0
    answer_tokens: int = 0
    replica: str = ""
    """Which cloud replica answered (host:port)."""
    finish_reason: FinishReason = FinishReason.STOP
    """"stop", "length" (the answer hit its token budget) or "repetition"; "" on the wire = "stop"."""
    cost: CloudCost | None = None
    """The engine work this answer cost the cloud; None from a cloud that does not report it."""


@dataclass(kw_only=True)
class RetryAdvice:
    attempt: int
    num_drafts: int
    sampling: SamplingParams
    reason: str


@dataclass(kw_only=True)
class DraftFrom:
    """The cloud asks for drafts that continue ``text``, the answer so far as the target writes it: it took
    the last round's draft tokens as far as it would write them itself (``coinfer.cloud.speculation``)."""

    text: str
    max_new_tokens: int = 0
    """New tokens each draft may add (0: the edge's own budget)."""
    num_drafts: int = 1
    round: int = 1
    """1-based: the answer's continuation rounds so far."""


@dataclass
class SessionAccepted:
    request_id: str
    rules: list[str]
    recommended_drafts: int


@dataclass(kw_only=True)
class Status:
    queue_depth: int
    running: int
    utilisation: float
    recommended_drafts: int
    active_sessions: int
    model: str
    ready: bool
    weight_a: float = 0.0
    weight_b: float = 0.0
    weight_g: float = 0.0
    weight_updates: int = 0
    kv_cache_usage: float = 0.0
    load: float = 0.0
    draining: bool = False


CloudEvent = SessionAccepted | Verdict | AnswerChunk | Summary | RetryAdvice | DraftFrom
