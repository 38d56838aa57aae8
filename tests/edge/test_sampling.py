import numpy as np
import pytest

from coinfer.errors import InvalidArgument
from edge.sampling import Sampling, apply_penalties, sample_next, top_p_filter


def test_greedy_takes_argmax_and_reports_model_logprob():
    logits = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tok, lp = sample_next(logits, np.zeros_like(logits), Sampling(temperature=0.0, presence_penalty=0, frequency_penalty=0), [])
    assert tok.tolist() == [1, 0]
    expect = logits[0, 1] - np.log(np.exp(logits[0]).sum())
    assert lp[0] == pytest.approx(expect)


def test_penalties_follow_openai_definition():
    logits = np.zeros((1, 3))
    counts = np.array([[0.0, 1.0, 3.0]])
    out = apply_penalties(logits, counts, presence=0.5, frequency=0.1)
    assert out.tolist() == [[0.0, -0.6, pytest.approx(-0.8)]]


def test_top_p_keeps_smallest_nucleus():
    p = np.array([[0.5, 0.3, 0.15, 0.05]])
    assert top_p_filter(p, 0.8).round(4).tolist() == [[0.625, 0.375, 0.0, 0.0]]
    assert top_p_filter(p, 0.5).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert top_p_filter(p, 1.0) is p


def test_rows_are_independent_given_their_seed():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50))
    s = Sampling(temperature=1.0, top_p=1.0)
    together, _ = sample_next(logits, np.zeros((3, 50)), s, [np.random.default_rng(i) for i in range(3)])
    alone = [sample_next(logits[i : i + 1], np.zeros((1, 50)), s, [np.random.default_rng(i)])[0][0] for i in range(3)]
    assert together.tolist() == alone


@pytest.mark.parametrize("kw,field", [
    ({"temperature": -0.1}, "sampling.temperature"), ({"temperature": 2.5}, "sampling.temperature"),
    ({"top_p": 0.0}, "sampling.top_p"), ({"presence_penalty": 3}, "sampling.presence_penalty"),
    ({"frequency_penalty": -3}, "sampling.frequency_penalty"), ({"n": 0}, "sampling.n"), ({"n": 99}, "sampling.n"),
    ({"max_new_tokens": 0}, "sampling.max_new_tokens"), ({"stop": ("",)}, "sampling.stop"),
])
def test_invalid_sampling_names_the_field(kw, field):
    with pytest.raises(InvalidArgument, match=f"^{field}:"):
        Sampling(**kw).validate()


def test_seed_defaults():
    s = Sampling()
    assert (s.n, s.temperature, s.top_p, s.presence_penalty, s.frequency_penalty, s.max_new_tokens) == (
        5, 0.3, 0.95, 0.2, 0.1, 256)


def test_sampled_frequencies_follow_the_distribution():
    import numpy as np

    from edge.sampling import Sampling, sample_next

    probs = np.array([0.1, 0.2, 0.0, 0.7])
    logits = np.log(np.where(probs > 0, probs, 1e-30))[None].repeat(4000, axis=0)
    s = Sampling(n=1, temperature=1.0, top_p=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    rngs = [np.random.default_rng(i) for i in range(4000)]
    tokens, _ = sample_next(logits, np.zeros_like(logits), s, rngs)
    freq = np.bincount(tokens, minlength=4) / len(tokens)
    assert freq[2] == 0.0  # a zero-probability token is never drawn
    assert np.allclose(freq, probs, atol=0.03), freq
