"""Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds, stop strings."""
from __future__ import annotations

import numpy as np
import pytest

from lightspeed.generate import (Sampler, SamplingParams, StopStringFilter, apply_repetition_penalty,
                                 filter_logits)


def logits_of(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def kept(x: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.isfinite(x)).tolist())


def test_greedy_is_argmax_first_on_ties():
    s = Sampler(SamplingParams(temperature=0.0))
    assert s(np.array([0.1, 3.0, -1.0, 3.0], dtype=np.float32)) == 1
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal(50).astype(np.float32)
        assert s(x) == int(np.argmax(x))


def test_seed_makes_sampling_reproducible():
    x = np.random.default_rng(1).standard_normal(200).astype(np.float32)
    draw = lambda seed: [Sampler(SamplingParams(temperature=1.0, seed=seed))(x) for _ in range(1)] + \
        list(_draws(x, SamplingParams(temperature=1.0, seed=seed), 30))  # noqa: E731
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def _draws(x, params, n):
    s = Sampler(params)
    return [s(x) for _ in range(n)]


def test_temperature_sampling_follows_the_softmax():
    probs = np.array([0.5, 0.25, 0.15, 0.1])
    n = 20000
    counts = np.bincount(_draws(logits_of(probs), SamplingParams(temperature=1.0, seed=0), n), minlength=4)
    # binomial standard error is at most 0.0036 here; allow 5 of them
    np.testing.assert_allclose(counts / n, probs, atol=0.018)
    # temperature 0.5 squares the odds
    sharp = probs ** 2 / (probs ** 2).sum()
    counts = np.bincount(_draws(logits_of(probs), SamplingParams(temperature=0.5, seed=1), n), minlength=4)
    np.testing.assert_allclose(counts / n, sharp, atol=0.018)


def test_top_k():
    x = np.array([1.0, 5.0, 3.0, 4.0, 2.0], dtype=np.float32)
    assert kept(filter_logits(x, top_k=2)) == {1, 3}
    assert kept(filter_logits(x, top_k=0)) == set(range(5))
    assert kept(filter_logits(x, top_k=10)) == set(range(5))
    assert set(_draws(x, SamplingParams(temperature=5.0, top_k=2, seed=0), 300)) == {1, 3}
    assert set(_draws(x, SamplingParams(temperature=5.0, top_k=1, seed=0), 50)) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    x = logits_of([0.05, 0.5, 0.15, 0.3])
    assert kept(filter_logits(x, top_p=0.49)) == {1}
    assert kept(filter_logits(x, top_p=0.79)) == {1, 3}
    assert kept(filter_logits(x, top_p=0.81)) == {1, 3, 2}
    assert kept(filter_logits(x, top_p=1.0)) == {0, 1, 2, 3}
    counts = np.bincount(_draws(x, SamplingParams(temperature=1.0, top_p=0.79, seed=3), 20000), minlength=4)
    np.testing.assert_allclose(counts / 20000, [0, 0.5 / 0.8, 0, 0.3 / 0.8], atol=0.02)


def test_min_p():
    x = logits_of([0.4, 0.3, 0.2, 0.1])
    assert kept(filter_logits(x, min_p=0.45)) == {0, 1, 2}
    assert kept(filter_logits(x, min_p=0.6)) == {0, 1}
    assert kept(filter_logits(x, min_p=1.0)) == {0}


def test_repetition_penalty():
    x = np.array([2.0, -2.0, 1.0, -1.0], dtype=np.float32)
    out = apply_repetition_penalty(x, [0, 1, 1], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, -1.0])
    assert apply_repetition_penalty(x, [], 2.0) is x
    # a penalty large enough flips the greedy choice away from a repeated token
    s = Sampler(SamplingParams(repetition_penalty=3.0))
    assert s(np.array([3.0, 2.0], dtype=np.float32), previous=[0]) == 1
    assert s(np.array([3.0, 2.0], dtype=np.float32), previous=[1]) == 0


def test_filters_agree_with_transformers():
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    rng = np.random.default_rng(5)
    for trial in range(20):
        x = (rng.standard_normal(300) * 3).astype(np.float32)
        ids = torch.tensor([rng.integers(0, 300, 12)])
        t = torch.from_numpy(x)[None]
        cases = [
            (dict(top_k=7), lp.TopKLogitsWarper(7)),
            (dict(top_p=0.6), lp.TopPLogitsWarper(0.6)),
            (dict(top_p=0.95), lp.TopPLogitsWarper(0.95)),
            (dict(min_p=0.05), lp.MinPLogitsWarper(0.05)),
        ]
        for ours, theirs in cases:
            want = theirs(ids, t.clone())[0].numpy()
            assert kept(filter_logits(x, **ours)) == kept(want), (trial, ours)
        want = lp.RepetitionPenaltyLogitsProcessor(1.3)(ids, t.clone())[0].numpy()
        np.testing.assert_allclose(apply_repetition_penalty(x, ids[0].tolist(), 1.3), want, rtol=1e-6)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(min_p=-0.1), dict(repetition_penalty=0.0)])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Sampler(SamplingParams(**bad))


def test_stop_strings_hold_back_possible_prefixes():
    f = StopStringFilter(["</s>", "STOP"])
    assert f.push("Hello <") == "Hello "
    assert f.push("/") == ""
    assert f.push("x") == "</x"          # not a stop string after all
    assert f.push(" ST") == " "
    assert f.push("OP and more") == ""   # found: nothing after it
    assert f.stopped


def test_stop_string_inside_one_piece_and_flush():
    f = StopStringFilter(["\n\n"])
    assert f.push("a\n\nb") == "a" and f.stopped
    g = StopStringFilter(["END"])
    assert g.push("the EN") == "the "
    assert g.flush() == "EN"
    assert StopStringFilter([]).push("anything") == "anything"
