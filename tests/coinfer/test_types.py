"""The closed sets of the domain types."""

import json

from coinfer.types import AnswerSource, ResultSource


def test_every_cloud_answer_source_has_the_edges_name():
    assert {ResultSource.of(s) for s in AnswerSource if s is not AnswerSource.UNSPECIFIED} == {
        ResultSource.REFINED,
        ResultSource.DRAFT,
        ResultSource.CLOUD,
    }
    assert ResultSource.of(0) is ResultSource.CLOUD and ResultSource.of(99) is ResultSource.CLOUD  # unset / newer
    # a StrEnum: the wire and the JSON carry its value, as before it was one
    assert json.dumps({"source": ResultSource.EDGE_ONLY}) == '{"source": "edge_only"}'
