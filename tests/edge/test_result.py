"""The result a run of a plan returns, and the builder a run fills in."""

from coinfer import types as t


def test_the_result_builder_has_exactly_the_results_fields():
    import dataclasses

    from coinfer.edge.result import EdgeResult, ResultBuilder

    assert [f.name for f in dataclasses.fields(ResultBuilder)] == [f.name for f in dataclasses.fields(EdgeResult)]


def test_a_summarys_strings_become_the_edges_enums():
    from coinfer.edge.result import ResultBuilder

    b = ResultBuilder()
    b.take(t.Summary(answer="8", source=t.AnswerSource.DRAFT, refine_mode="prefix", finish_reason=""))
    assert (b.refine_mode, b.finish_reason, b.source) == (t.RefineMode.PREFIX, t.FinishReason.STOP, "draft")
    b.take(t.Summary(answer="8", source=t.AnswerSource.CLOUD, refine_mode="", finish_reason="length"))
    assert b.refine_mode is None and b.finish_reason is t.FinishReason.LENGTH
    b.take(t.Summary(answer="8", source=t.AnswerSource.CLOUD, refine_mode="telepathy", finish_reason="moon"))
    assert b.refine_mode is None and b.finish_reason is t.FinishReason.STOP  # a newer cloud's: tolerated
