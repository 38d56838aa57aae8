"""One edge request: as a front end builds it (``SolveRequest``), and as it runs once checked
(``ValidRequest``: the task resolved, the problem parsed and the rules compiled once, the sampling and
the deadline settled). The checks are the ones every request gets, gRPC and HTTP alike."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from coinfer import types as t
from coinfer.chat import ChatMessage, conversation, question_of
from coinfer.edge.config import EdgeConfig
from coinfer.edge.kinds import RequestedPlan
from coinfer.edge.sampling import Sampling
from coinfer.errors import InvalidArgument, require
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import TASKS, Task, get_task
from coinfer.validate import check_deadline, check_question, check_request_id


@dataclass(kw_only=True)
class SolveRequest:
    prompt: str
    """The question as one user turn ("" when ``messages`` carries the conversation)."""
    task: str = ""
    """Empty: the task preset whose problem format the question matches, else an open request."""
    rules: list[Rule] = field(default_factory=list)
    sampling: t.SamplingParams | None = None
    """Sampling of the drafts and of the cloud's refinement (None: the daemon's draft defaults
    and the cloud's refinement defaults)."""
    num_drafts: int = 0
    plan: RequestedPlan = RequestedPlan.AUTO
    """A front end's string is converted (and refused by name) when the request is checked."""
    deadline_ms: int = 0
    request_id: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    """The conversation (system message and history kept)."""
    extraction: Extraction = field(default_factory=Extraction)
    refine: t.SamplingParams | None = None
    """Sampling of the cloud's refinement; None: ``sampling`` when given, else the cloud's defaults."""

    @property
    def question(self) -> str:
        return question_of(conversation(self.prompt, self.messages))


@dataclass(frozen=True, kw_only=True)
class ValidRequest:
    """A request checked and compiled: what the lifecycle and the pipeline run."""

    req: SolveRequest
    """As the front end built it (its ``task`` resolved)."""
    task: Task
    ruleset: RuleSet
    """The request's rules over its parsed problem, compiled once."""
    sampling: Sampling
    """The drafts' sampling, the draft count settled."""
    deadline_s: float
    plan: RequestedPlan = RequestedPlan.AUTO
    refine: t.SamplingParams | None = None
    """The cloud refinement's sampling (None: the cloud's defaults)."""

    @property
    def conversation(self) -> list[ChatMessage]:
        """The request as a conversation (what the draft model's prompt is rendered from)."""
        return conversation(self.req.prompt, self.req.messages)

    def open_request(self, deadline_ms: int, expected_drafts: int, draft_model: str = "") -> t.OpenRequest:
        """The session's first message to the cloud (``draft_model``: the draft engine's identity, "" with
        none loaded)."""
        r = self.req
        return t.OpenRequest(
            request_id=r.request_id,
            task=r.task,
            prompt="" if r.messages else r.prompt,
            rules=list(r.rules),
            refine=self.refine,
            expected_drafts=expected_drafts,
            deadline_ms=deadline_ms,
            messages=list(r.messages),
            extraction=r.extraction,
            draft_model=draft_model,
            drafts_on_request=True,
        )

    @property
    def greedy_first(self) -> bool:
        """Whether the first draft is written greedily (``Draft.greedy``): an open request whose answer the cloud
        writes by exact verification (``SamplingParams.speculable``: the cloud's default greedy refinement, the
        client's own temperature 0, or sampling over the whole vocabulary, unpenalised), taking most of such a
        draft: where greedy, the tokens that are the target's argmax too; where sampled, each with the target's
        probability of it, largest at the draft model's argmax where the two agree."""
        return not self.req.task and (self.refine is None or self.refine.speculable)


def infer_task(prompt: str) -> str:
    """The task preset whose problem format ``prompt`` matches (apps need not name it); "" (an
    open request) when none does."""
    return _inferred(prompt)[0]


def _inferred(prompt: str) -> tuple[str, dict | None]:
    """``infer_task`` with the problem the matching preset parsed (None for an open request)."""
    for name, task in TASKS.items():
        try:
            return name, task.parse_problem(prompt)
        except InvalidArgument:
            continue
    return "", None


def compiled(
    req: SolveRequest,
    sampling: Sampling,
    deadline_s: float,
    *,
    plan: RequestedPlan = RequestedPlan.AUTO,
    refine: t.SamplingParams | None = None,
    spec: dict | None = None,
) -> ValidRequest:
    """``req`` with its problem parsed (``spec``: parsed already, when its task was inferred) and its
    rules compiled (bad rules: INVALID_ARGUMENT naming them). Blocking for hostile input: call it off
    the event loop."""
    task = get_task(req.task, "task")
    spec = spec if spec is not None else task.parse_problem(req.question)
    ruleset = RuleSet(req.rules, task, spec, "rules", req.extraction)
    return ValidRequest(
        req=req, task=task, ruleset=ruleset, sampling=sampling, deadline_s=deadline_s, plan=plan, refine=refine
    )


def checked(req: SolveRequest, cfg: EdgeConfig, recommended_drafts: int) -> ValidRequest:
    """Every check a request gets, once, then ``compiled``: ``InvalidArgument`` / ``ResourceExhausted``
    naming the field. Blocking (task parsers, rule compilers): call it off the event loop."""
    try:
        return _checked(req, cfg, recommended_drafts)
    except (ValueError, RecursionError):  # a task parser on hostile text (a 5,000-digit number)
        raise InvalidArgument("prompt: cannot be parsed (a number or nesting beyond any limit)") from None


def _checked(req: SolveRequest, c: EdgeConfig, recommended_drafts: int) -> ValidRequest:
    check_request_id(req.request_id)
    check_question(req.prompt, req.messages, c.max_prompt_chars)
    req.extraction.validate("extraction")
    plans = tuple(RequestedPlan)
    require(req.plan in plans, "plan", f"must be one of {', '.join(plans)}, got {req.plan!r}")
    require(0 <= req.num_drafts <= c.max_drafts, "num_drafts", f"must be in 0..{c.max_drafts}")
    check_deadline(req.deadline_ms)
    spec = None
    if not req.task:
        req.task, spec = _inferred(req.question)
    base = req.sampling or t.SamplingParams()
    n = req.num_drafts or min(c.max_drafts, recommended_drafts)
    s = Sampling(**{f.name: getattr(base, f.name) for f in dataclasses.fields(t.SamplingParams)}, n=n)
    s.validate("sampling", c.max_drafts, c.max_new_tokens)
    asked = RequestedPlan(req.plan)
    if asked is RequestedPlan.AUTO and c.plan != RequestedPlan.AUTO:
        asked = RequestedPlan(c.plan)  # the daemon's own plan stands in for auto
    deadline_s = (req.deadline_ms or c.deadline_ms) / 1e3
    # the user's sampling reaches the refinement too (OpenAI fidelity); unset: the cloud's defaults
    return compiled(req, s, deadline_s, plan=asked, refine=req.refine or req.sampling, spec=spec)
