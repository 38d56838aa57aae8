"""Pure logic of the split plan's cloud session (the session itself runs against real engines in tests/integration)."""

from coinfer import types as t
from coinfer.edge.remote import follow_advice
from coinfer.edge.sampling import Sampling


def test_retry_advice_changes_exploration_and_keeps_the_users_limits():
    mine = Sampling(temperature=0.0, max_new_tokens=24, seed=7, stop=("\n\n",), n=3)
    advice = t.RetryAdvice(
        1,
        6,
        t.SamplingParams(temperature=0.6, top_p=0.9, presence_penalty=0.4, frequency_penalty=0.2, max_new_tokens=256),
        "regex_failed x3",
    )
    nxt = follow_advice(mine, advice)
    assert (nxt.n, nxt.temperature, nxt.top_p, nxt.presence_penalty, nxt.frequency_penalty) == (6, 0.6, 0.9, 0.4, 0.2)
    assert (nxt.max_new_tokens, nxt.seed, nxt.stop) == (24, 7, ("\n\n",))  # the user's budget, seed and stops
    roomy = follow_advice(Sampling(max_new_tokens=1000, n=3), advice)
    assert roomy.max_new_tokens == 256  # and never more than the cloud advises
