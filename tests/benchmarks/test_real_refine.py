"""The refinement-guard benchmark's reading of a Solve stream (its real run needs the real model:
``python -m benchmarks.real_refine``)."""

from benchmarks import real_refine
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb


def _stream(drafts: list[str], chunks: list[str], reason: str, answer: str) -> list[epb.SolveEvent]:
    evs = [epb.SolveEvent(draft=pb.Draft(index=i, text=t)) for i, t in enumerate(drafts)]
    evs += [epb.SolveEvent(verdict=pb.Verdict(draft_index=i, valid=True)) for i in range(len(drafts))]
    evs += [epb.SolveEvent(chunk=pb.AnswerChunk(text=c)) for c in chunks]
    if reason:
        evs.append(epb.SolveEvent(reset=pb.AnswerReset(reason=reason)))
        evs.append(epb.SolveEvent(chunk=pb.AnswerChunk(text=answer)))
    evs.append(
        epb.SolveEvent(
            result=epb.SolveResult(answer=answer, source="draft" if reason else "refined", refine_mode="candidates")
        )
    )
    return evs


def test_a_refused_contradiction_counts_as_broken_only_without_the_guard():
    paris = "The capital of France is Paris."
    row = real_refine.outcome(
        _stream(
            [paris, paris + " "],
            ["The answer is ", "Luxembourg."],
            "refinement rejected: contradicts: the drafts agree",
            paris,
        ),
        r"paris",
    )
    assert row["agreed"] and row["drafts_right"] and row["agreed_on_answer"]
    assert row["without_guard"] == "The answer is Luxembourg." and row["answer"] == paris
    assert not row["right_without"] and row["right_with"]
    t = real_refine.tally([row])
    assert t["broke_without_guard"] == 1 and t["broke_with_guard"] == 0 and t["guard_refused"] == 1


def test_a_refinement_refused_for_another_reason_is_not_the_guards_doing():
    row = real_refine.outcome(
        _stream(["Paris.", "It is Paris."], ["(1) Paris"], "refinement rejected: scaffolding: x", "Paris."), r"paris"
    )
    assert not row["agreed"] and row["agreed_on_answer"]  # same answer, different words
    assert row["without_guard"] == row["answer"] == "Paris."
    assert real_refine.tally([row])["broke_all_right_without_guard"] == 0
