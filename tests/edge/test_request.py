"""Which requests the edge drafts greedily first (``ValidRequest.greedy_first``): those the cloud answers by
exact verification, greedy or sampled over the whole vocabulary (``SamplingParams.speculable``)."""

from __future__ import annotations

import pytest

from coinfer import types as t
from coinfer.edge.config import EdgeConfig
from coinfer.edge.request import SolveRequest, checked


def _first_greedy(refine: t.SamplingParams | None, prompt: str = "Why is the sky blue?") -> bool:
    return checked(SolveRequest(prompt=prompt, num_drafts=3, refine=refine), EdgeConfig(), 5).greedy_first


@pytest.mark.parametrize(
    ("refine", "greedy_first"),
    [
        (None, True),  # the cloud's default answer: greedy
        (t.SamplingParams(temperature=0.0, top_p=1.0, presence_penalty=0.0, frequency_penalty=0.0), True),
        (t.SamplingParams(temperature=0.8, top_p=1.0, presence_penalty=0.0, frequency_penalty=0.0), True),
        (t.SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=0.0, frequency_penalty=0.0), False),
        (t.SamplingParams(temperature=0.8, top_p=1.0, presence_penalty=0.5, frequency_penalty=0.0), False),
    ],
)
def test_an_open_request_is_drafted_greedily_first_where_the_cloud_can_take_its_tokens(refine, greedy_first):
    assert _first_greedy(refine) is greedy_first


def test_a_preset_is_not():
    assert not _first_greedy(None, prompt="If x=3 and y=5, compute x+y.")
