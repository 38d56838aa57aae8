import numpy as np
import pytest

from coinfer.edge.sampling import PRUNE_NATS, Sampling, apply_penalties, nucleus, penalize, sample_next, top_p_filter
from coinfer.errors import InvalidArgument


def test_greedy_takes_argmax_and_reports_model_logprob():
    logits = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tok, lp = sample_next(logits, [[], []], Sampling(temperature=0.0, presence_penalty=0, frequency_penalty=0), [])
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
    together, _ = sample_next(logits, [[], [], []], s, [np.random.default_rng(i) for i in range(3)])
    alone = [sample_next(logits[i : i + 1], [[]], s, [np.random.default_rng(i)])[0][0] for i in range(3)]
    assert together.tolist() == alone


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"temperature": -0.1}, "sampling.temperature"),
        ({"temperature": 2.5}, "sampling.temperature"),
        ({"top_p": 0.0}, "sampling.top_p"),
        ({"presence_penalty": 3}, "sampling.presence_penalty"),
        ({"frequency_penalty": -3}, "sampling.frequency_penalty"),
        ({"n": 0}, "sampling.n"),
        ({"n": 99}, "sampling.n"),
        ({"max_new_tokens": 0}, "sampling.max_new_tokens"),
        ({"stop": ("",)}, "sampling.stop"),
    ],
)
def test_invalid_sampling_names_the_field(kw, field):
    with pytest.raises(InvalidArgument, match=f"^{field}:"):
        Sampling(**kw).validate()


def test_a_standalone_check_holds_the_daemons_default_limits():
    from coinfer.edge.config import EdgeConfig

    cfg = EdgeConfig(model="m")
    Sampling(n=cfg.max_drafts, max_new_tokens=cfg.max_new_tokens).validate()  # the limits themselves pass
    for over in ({"n": cfg.max_drafts + 1}, {"max_new_tokens": cfg.max_new_tokens + 1}):
        with pytest.raises(InvalidArgument):
            Sampling(**over).validate()


def test_seed_defaults():
    s = Sampling()
    assert (s.n, s.temperature, s.top_p, s.presence_penalty, s.frequency_penalty, s.max_new_tokens) == (
        5,
        0.3,
        0.95,
        0.2,
        0.1,
        256,
    )


def test_sampled_frequencies_follow_the_distribution():
    import numpy as np

    from coinfer.edge.sampling import Sampling, sample_next

    probs = np.array([0.1, 0.2, 0.0, 0.7])
    logits = np.log(np.where(probs > 0, probs, 1e-30))[None].repeat(4000, axis=0)
    s = Sampling(n=1, temperature=1.0, top_p=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    rngs = [np.random.default_rng(i) for i in range(4000)]
    tokens, _ = sample_next(logits, [[]] * len(logits), s, rngs)
    freq = np.bincount(tokens, minlength=4) / len(tokens)
    assert freq[2] == 0.0  # a zero-probability token is never drawn
    assert np.allclose(freq, probs, atol=0.03), freq


def test_sparse_penalties_equal_the_dense_definition():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 30)).astype(np.float32)
    history = [[3, 3, 7, 3], []]
    counts = np.zeros((2, 30))
    for r, ids in enumerate(history):
        for t in ids:
            counts[r, t] += 1
    assert np.allclose(penalize(logits, history, 0.5, 0.1), apply_penalties(logits, counts, 0.5, 0.1))


@pytest.mark.parametrize("vocab,scale,top_p", [(50, 3.0, 0.9), (5000, 4.0, 0.95), (5000, 0.01, 0.95)])
def test_nucleus_equals_the_full_sort_reference(vocab, scale, top_p):
    rng = np.random.default_rng(vocab)
    for _ in range(20):
        e = np.exp(rng.normal(size=vocab) * scale)
        p = e / e.sum()
        assert nucleus(p, top_p).tolist() == np.flatnonzero(top_p_filter(p[None], top_p)[0]).tolist()


def test_pruned_sampling_matches_the_exact_distribution_and_penalties():
    """A row with a long tail: the survivors' sampling distribution equals the full softmax's
    (the pruned tail holds < 1e-4 of the mass), penalties included; greedy is the penalised argmax."""
    rng = np.random.default_rng(3)
    v = 20000
    logits = rng.normal(size=v).astype(np.float32)
    logits[:5] += np.array([9.0, 8.5, 8.0, 7.0, 2.0], np.float32)
    s = Sampling(n=1, temperature=0.7, top_p=1.0, presence_penalty=0.5, frequency_penalty=0.25)
    history = [[1, 1, 3]]
    draws = 4000
    tokens, _ = sample_next(
        np.repeat(logits[None], draws, 0), history * draws, s, [np.random.default_rng(i) for i in range(draws)]
    )
    adj = penalize(logits[None].astype(np.float64), history, 0.5, 0.25)[0] / 0.7
    exact = np.exp(adj - adj.max())
    exact /= exact.sum()
    freq = np.bincount(tokens, minlength=v) / draws
    assert np.abs(freq[:5] - exact[:5]).max() < 0.03, (freq[:5], exact[:5])
    assert exact[tokens].min() >= exact.max() * np.exp(-PRUNE_NATS) * 0.999  # only survivors of the prune
    greedy, _ = sample_next(
        logits[None], [[0, 0, 0, 0, 0]], Sampling(temperature=0.0, presence_penalty=1.0, frequency_penalty=1.0), []
    )
    expected = int(np.argmax(penalize(logits[None], [[0, 0, 0, 0, 0]], 1.0, 1.0)[0]))
    assert greedy[0] == expected != 0  # token 0, the raw best, lost 6 to the penalties
    assert PRUNE_NATS >= 10


def test_top_p_sampling_draws_only_from_the_nucleus():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)[None].repeat(3000, axis=0)
    s = Sampling(n=1, temperature=1.0, top_p=0.75, presence_penalty=0.0, frequency_penalty=0.0)
    tokens, lp = sample_next(logits, [[]] * 3000, s, [np.random.default_rng(i) for i in range(3000)])
    freq = np.bincount(tokens, minlength=4) / len(tokens)
    assert freq[2] == freq[3] == 0.0 and np.allclose(freq[:2], [0.625, 0.375], atol=0.03), freq
    assert np.allclose(lp, np.log(probs)[tokens], atol=1e-5)  # the unpenalised model's logprob
