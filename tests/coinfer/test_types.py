"""The closed sets of the domain types."""

import json

from coinfer.types import AnswerSource, CloudCost, RequestTally, ResultSource


def test_every_cloud_answer_source_has_the_edges_name():
    assert {ResultSource.of(s) for s in AnswerSource if s is not AnswerSource.UNSPECIFIED} == {
        ResultSource.REFINED,
        ResultSource.DRAFT,
        ResultSource.CLOUD,
    }
    assert ResultSource.of(0) is ResultSource.CLOUD and ResultSource.of(99) is ResultSource.CLOUD  # unset / newer
    # a StrEnum: the wire and the JSON carry its value, as before it was one
    assert json.dumps({"source": ResultSource.EDGE_ONLY}) == '{"source": "edge_only"}'


def test_a_request_tally_counts_delta_and_cumulative_outputs_alike():
    """Both engines fold a request into the session's cost through one tally: two samples of 3 and 5 tokens
    streamed as new tokens (the remote server) or as totals so far (the in-process engine's final outputs)."""
    delta, total = RequestTally(prompt=10, scored=False), RequestTally(prompt=10, scored=False)
    for new, so_far, cached in (([(0, 1), (1, 2)], [(0, 1), (1, 2)], 0), ([(0, 2), (1, 3)], [(0, 3), (1, 5)], 4)):
        delta.output(cached, new)
        total.output(cached, so_far, delta=False)
    costs = []
    for tally in (delta, total):
        cost = CloudCost()
        tally.charge(cost)
        costs.append(cost)
    assert costs[0] == costs[1]
    assert (costs[0].engine_requests, costs[0].decoded_tokens, costs[0].cached_tokens, costs[0].steps) == (1, 8, 4, 5)


def test_a_request_that_returned_nothing_costs_nothing_and_a_scoring_one_counts_its_prefill():
    cost = CloudCost()
    RequestTally(prompt=10, scored=True).charge(cost)  # refused before any output
    RequestTally(prompt=10, scored=True).charge(None)  # no session counting
    assert cost == CloudCost()
    scoring = RequestTally(prompt=10, scored=True)
    scoring.output(3, [(0, 1)])
    scoring.charge(cost)
    assert (cost.scored_tokens, cost.steps, cost.work_tokens) == (7, 1, 8)
