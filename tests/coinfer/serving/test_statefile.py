"""``OffLoopWriter``: a state saved on every answer is written at most once per interval, the latest state
rendered when its write begins; a flush writes it at once."""

import asyncio
import time

from coinfer.serving.statefile import OffLoopWriter
from tests.waiting import until


def test_saves_within_the_interval_are_one_write_of_the_latest_state_and_a_flush_cuts_the_wait(tmp_path):
    path = tmp_path / "state.json"
    rendered: list[int] = []
    state = {"n": 0}

    def render() -> str:
        rendered.append(state["n"])
        return str(state["n"])

    async def main() -> float:
        w = OffLoopWriter(path, min_interval_s=30.0)
        for n in range(1, 51):  # 50 answers, each changing the state and saving it
            state["n"] = n
            w.write(render)
            await asyncio.sleep(0)
        await until(path.exists, guard_s=10, what="the first save written")
        t0 = time.monotonic()
        await w.flush()  # the 30-second interval is cut short
        return time.monotonic() - t0

    # a hang guard under the interval: the flush took a few ms here (the first write 0.02 s); uncut it takes 30 s
    assert asyncio.run(main()) < 10.0
    # the first save written at once; the 49 after it coalesced into one write of the last state
    assert rendered == [1, 50] and path.read_text() == "50"


def test_outside_an_event_loop_a_save_is_written_at_once(tmp_path):
    w = OffLoopWriter(tmp_path / "s.json", min_interval_s=30.0)
    w.write(lambda: "a")
    w.write(lambda: "b")
    assert (tmp_path / "s.json").read_text() == "b"
