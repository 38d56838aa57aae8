"""benchmarks.replica.ReplayDrafts: draws recorded per request while recording, replayed in turn under load, a
request never recorded drafted for real and counted (the servers themselves: tests/benchmarks/test_capacity.py)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.replica import ReplayDrafts


@dataclass
class Draft:
    text: str
    edge_ms: float = 0.0


@dataclass
class Sampling:
    n: int = 2


class Engine:
    """A draft engine whose every call is a fresh draw (as the unseeded draft model's)."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, prompt, s, on_draft=None, cancelled=None, greedy=0, greedy_tokens=0):
        self.calls += 1
        return [Draft(f"{prompt}-{self.calls}")]


def test_recording_passes_add_draws_up_to_the_limit_and_load_replays_them_in_turn():
    real = Engine()
    drafts = ReplayDrafts(real, draws=2)
    first = drafts.generate("p", Sampling())
    second = drafts.generate("p", Sampling())
    assert real.calls == 2 and first != second  # two recording passes: two draws
    assert drafts.generate("p", Sampling()) in (first, second) and real.calls == 2  # a third pass replays
    drafts.recording = False
    seen = [drafts.generate("p", Sampling())[0].text for _ in range(4)]
    assert seen[0] != seen[1] and seen[:2] == seen[2:]  # in turn
    assert drafts.misses == 0 and real.calls == 2
    assert drafts.generate("q", Sampling())[0].text == "q-3" and drafts.misses == 1  # never recorded: drafted
    assert drafts.fresh == 3 and drafts.calls == 8


def test_a_replayed_draw_reaches_on_draft_and_stops_when_cancelled():
    drafts = ReplayDrafts(Engine(), draws=1)
    drafts.generate("p", Sampling())
    drafts.recording = False
    got = []
    assert drafts.generate("p", Sampling(), on_draft=got.append) == got and len(got) == 1
    assert drafts.generate("p", Sampling(), cancelled=lambda: True) == []
