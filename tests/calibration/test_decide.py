"""The choice from paired rounds: the incumbent stays unless a challenger is supported faster."""

from __future__ import annotations

from mixprec.calibration.decide import MIN_ROUNDS, compare


def test_a_challenger_faster_in_every_round_wins():
    v = compare({"rules": [1.0, 1.1, 0.9, 1.0, 1.05, 1.0], "naive": [0.5, 0.56, 0.45, 0.5, 0.52, 0.5]}, "rules", ["naive"])
    assert v.status == {"naive": "faster"} and v.winner == "naive" and v.settled


def test_a_slower_challenger_leaves_the_incumbent():
    v = compare({"rules": [1.0] * 6, "fp32": [2.0, 2.1, 1.9, 2.0, 2.0, 2.05]}, "rules", ["fp32"])
    assert v.status == {"fp32": "slower"} and v.winner == "rules" and v.settled


def test_an_interval_within_the_margin_is_no_gain():
    v = compare({"rules": [1.0] * 6, "other": [0.995, 1.0, 0.999, 1.001, 1.0, 0.998]}, "rules", ["other"])
    assert v.status == {"other": "no gain"} and v.winner == "rules" and v.settled


def test_scattered_rounds_are_undecided_and_never_a_winner():
    v = compare({"rules": [1.0] * 8, "other": [0.5, 2.0, 0.6, 1.8, 0.55, 1.9, 0.5, 2.1]}, "rules", ["other"])
    assert v.status == {"other": "undecided"} and v.winner == "rules" and not v.settled
    assert v.contenders == ("other",)


def test_too_few_rounds_decide_nothing():
    v = compare({"rules": [1.0] * (MIN_ROUNDS - 1), "other": [0.1] * (MIN_ROUNDS - 1)}, "rules", ["other"])
    assert v.status == {"other": "undecided"} and v.winner == "rules"


def test_two_faster_challengers_the_better_wins_and_a_close_pair_stays_open():
    base = [1.0] * 8
    v = compare({"rules": base, "a": [0.5] * 8, "b": [0.25] * 8}, "rules", ["a", "b"])
    assert v.winner == "b" and v.settled
    close = compare({"rules": base, "a": [0.5, 0.4, 0.5, 0.6, 0.5, 0.45, 0.55, 0.5],
                     "b": [0.45, 0.5, 0.55, 0.5, 0.4, 0.5, 0.5, 0.6]}, "rules", ["a", "b"])
    assert set(close.status.values()) == {"faster"} and not close.settled


def test_of_two_faster_challengers_the_rounds_cannot_tell_apart_the_more_exact_wins():
    base = [1.0] * 8
    a = [0.50, 0.52, 0.48, 0.5, 0.51, 0.49, 0.5, 0.5]
    b = [0.51, 0.50, 0.49, 0.5, 0.50, 0.50, 0.52, 0.49]
    samples = {"rules": base, "fp32-high": a, "fp32": b}
    assert compare(samples, "rules", ["fp32-high", "fp32"], quality={"fp32-high": 45.0, "fp32": float("inf")}).winner == "fp32"
    assert compare(samples, "rules", ["fp32-high", "fp32"], quality={"fp32-high": 90.0, "fp32": 45.0}).winner == "fp32-high"
    clearly = {"rules": base, "fp32-high": [0.25] * 8, "fp32": b}  # clearly faster wins whatever its quality
    assert compare(clearly, "rules", ["fp32-high", "fp32"], quality={"fp32-high": 45.0, "fp32": float("inf")}).winner == "fp32-high"
