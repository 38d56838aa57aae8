"""The policy's thresholds as pure decisions (no engine, no I/O): the likelihood floor a draft must
reach to be valid, and whether the best verified draft is the answer as it stands.

Each takes the policy (``PolicyConfig``) and the numbers the verifier measured; the judge and the
answerer call them with what they recorded.
"""

from __future__ import annotations

import math

from coinfer import types as t
from coinfer.cloud.config import PolicyConfig
from coinfer.cloud.ranking import Judged


def reported(own: float | None) -> bool:
    """Whether the edge reported its draft's own mean logprob: proto3 sends an unset float as 0, and a
    real mean logprob is below 0."""
    return own is not None and own < 0.0


def likelihood_floor(p: PolicyConfig, own: float | None) -> float:
    """The likelihood threshold for a draft whose model gave it mean logprob ``own`` (None: the
    absolute one). Relative to the draft model's own confidence, so that free prose (a real model's
    drafts score -0.6..-2 per token: natural text is not formulaic) passes where the target agrees
    with the draft model, and text the target finds far less likely than the draft model did fails;
    never stricter than ``min_mean_logprob``, never looser than its floor."""
    if not reported(own) or p.relative_margin is None:
        return p.min_mean_logprob
    return max(p.min_mean_logprob_floor, min(p.min_mean_logprob, own - p.relative_margin))


def not_as_is(
    p: PolicyConfig, best: Judged, agree: float, *, free_text: bool, min_lp: float | None, mean_lp: float | None
) -> str:
    """Why the best verified draft is not the answer as it stands ("" : it is). It is when the target
    finds it likely (mean and least likely token) and the drafts agree on its answer: refining it would
    spend cloud decode tokens to write what the draft already says. ``free_text``: an open request's
    draft with nothing extracted (``free_text_not_as_is``). ``min_lp`` / ``mean_lp``: the target's least
    likely token and mean logprob of the draft, None where the verifier measured none (the judge's
    score stands alone; a likelihood verdict without logprobs has none to vouch for)."""
    if min_lp is None:
        min_lp = 0.0 if p.verifier == t.VerifierKind.JUDGE else -math.inf
    if free_text:
        return free_text_not_as_is(p, best.draft.mean_logprob, mean_lp, min_lp)
    if best.verdict.score < p.accept_min_score:
        return f"score {best.verdict.score:.2f} < {p.accept_min_score:.2f}"
    if agree < p.accept_min_agreement:
        return f"agreement {agree:.2f} < {p.accept_min_agreement:.2f}"
    if min_lp < p.accept_min_token_logprob:
        return f"a token at logprob {min_lp:.2f} < {p.accept_min_token_logprob:.2f}"
    return ""


def free_text_not_as_is(p: PolicyConfig, own: float, mean: float | None, min_lp: float) -> str:
    """Free text (nothing to extract, so nothing for drafts to agree on, and prose never scores like a
    formula): the draft stands when the target finds it about as likely as the draft model did
    (``PolicyConfig.accept_free_text_margin``) with no token it finds very unlikely. A real model's INT8
    draft is that model's own answer; refining it doubled split's latency (SmolLM2: 13.4 s against the
    cloud plan's 6.8 s) to rewrite the same prose."""
    if p.accept_free_text_margin is None or mean is None or not reported(own):
        return "free text: no relative likelihood to judge it by"
    if mean < own - p.accept_free_text_margin:
        return f"free text: target mean logprob {mean:.2f} < own {own:.2f} - {p.accept_free_text_margin:.2f}"
    if min_lp < p.accept_free_text_min_token_logprob:
        return f"free text: a token at logprob {min_lp:.2f} < {p.accept_free_text_min_token_logprob:.2f}"
    return ""


def cut_short(best: Judged, answer_budget: int) -> bool:
    """The best draft stopped at the edge's draft budget, shorter than the answer budget the request gives
    the cloud (drafts: 256 tokens by default, the cloud's answer 512): taken as is, the answer would end
    where the target's own would not."""
    return best.draft.truncated and answer_budget > best.draft.num_tokens
