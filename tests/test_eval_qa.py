"""QA answer vocabulary and accuracy: ordering, normalisation, OOV answers counted as wrong, confusion by type."""

from __future__ import annotations

import re

import pytest

from vlp.eval.qa import answer_type_map, build_answer_vocab, qa_metrics


def test_vocab_most_frequent_first_ties_alphabetical_and_normalised() -> None:
    answers = ["Red", "blue ", "red", "circle", " BLUE", "red", "two", "square", "Circle", ""]
    # counts after strip+lower: red 3, blue 2, circle 2, square 1, two 1; "" is skipped
    assert build_answer_vocab(answers, size=10) == ["red", "blue", "circle", "square", "two"]
    assert build_answer_vocab(answers, size=3) == ["red", "blue", "circle"]
    assert build_answer_vocab(iter(answers), size=1) == ["red"]  # any iterable


def test_vocab_size_must_be_positive() -> None:
    for size in (0, -1, True, 2.0, "3"):  # a bool is an int to Python, not a size
        message = rf"^answer vocabulary size must be an int >= 1, got {re.escape(repr(size))}$"
        with pytest.raises(ValueError, match=message):
            build_answer_vocab(["a"], size=size)


def test_vocab_keeps_the_released_codes_1500_by_default() -> None:
    answers = [f"a{i:04d}" for i in range(1600)] + ["a1599"]  # one answer twice: it comes first
    vocab = build_answer_vocab(answers)
    assert len(vocab) == 1500 and vocab[:2] == ["a1599", "a0000"] and vocab[-1] == "a1498"


def test_accuracy_counts_oov_answers_as_wrong() -> None:
    vocab = ["red", "blue", "circle", "two"]
    answers = ["red", "blue", "circle", "purple", "three", "two"]  # purple and three are OOV
    types = ["color", "color", "shape", "color", "count", "count"]
    # the model predicts the nearest vocabulary entries; "red" for the OOV "purple" can never be right
    predictions = ["Red ", "red", "circle", "red", "two", "two"]
    m = qa_metrics(predictions, answers, types, vocab)
    # correct: q0 (normalised "red"), q2, q5 -> 3 of 6; the two OOV questions count in the denominator
    assert m["accuracy"] == pytest.approx(3 / 6)
    assert m["n"] == 6 and m["n_oov"] == 2
    assert m["oov_rate"] == pytest.approx(2 / 6)
    assert m["acc_in_vocab"] == pytest.approx(3 / 4)  # q0, q1, q2, q5 answerable, q1 wrong
    # per type: color q0 ok, q1 wrong, q3 OOV -> 1/3; shape 1/1; count q4 OOV, q5 ok -> 1/2
    assert m["acc_color"] == pytest.approx(1 / 3)
    assert m["acc_shape"] == 1.0
    assert m["acc_count"] == pytest.approx(1 / 2)


def test_prediction_equal_to_an_oov_gold_answer_is_still_wrong() -> None:
    m = qa_metrics(["purple"], ["purple"], ["color"], vocab=["red"])
    assert m["accuracy"] == 0.0 and m["n_oov"] == 1 and m["acc_in_vocab"] == 0.0


def test_confusion_by_answer_type() -> None:
    vocab = ["red", "blue", "circle", "two", "grass"]
    answers = ["red", "blue", "circle", "two", "purple", "red"]
    types = ["color", "color", "shape", "count", "color", "color"]
    predictions = ["red", "circle", "two", "two", "red", "banana"]
    m = qa_metrics(predictions, answers, types, vocab)
    # the type of a prediction is the type its answer has in the gold data: red, blue -> color; circle -> shape;
    # two -> count; banana never is a gold answer -> "unseen"; q4's gold "purple" is OOV -> "oov"
    assert m["confusion"] == {
        "color": {"color": 1, "shape": 1, "oov": 1, "unseen": 1},
        "count": {"count": 1},
        "shape": {"count": 1},
    }
    assert sum(sum(row.values()) for row in m["confusion"].values()) == m["n"]


def test_answer_type_map_majority_then_alphabetical() -> None:
    mapping = answer_type_map(["one", "One", "one", "two", "two"], ["count", "count", "what", "what", "count"])
    # "one": count 2 vs what 1 -> count; "two": count 1 vs what 1 -> tie -> alphabetical "count"
    assert mapping == {"one": "count", "two": "count"}
    # the majority wins over the alphabet: "one" is a "what" answer twice and a "count" once
    assert answer_type_map(["one", "one", "ONE"], ["what", "count", "what"]) == {"one": "what"}
    with pytest.raises(ValueError, match="shorter"):  # one type per answer, or nothing
        answer_type_map(["one", "two"], ["count"])


def test_confusion_counts_repeats() -> None:
    m = qa_metrics(["red", "red", "blue"], ["red", "blue", "blue"], ["color"] * 3, vocab=["red", "blue"])
    assert m["confusion"] == {"color": {"color": 3}}  # three color questions, each predicted a color answer
    assert m["acc_color"] == pytest.approx(2 / 3)


def test_explicit_type_map_is_used_for_predictions() -> None:
    m = qa_metrics(["cat"], ["dog"], ["what"], vocab=["cat", "dog"], type_of={"cat": "who"})
    assert m["confusion"] == {"what": {"who": 1}}


def test_input_errors() -> None:
    """Each error names what is wrong, word for word (what a user reads)."""
    with pytest.raises(ValueError, match="one entry per question"):
        qa_metrics(["a"], ["a", "b"], ["x", "x"], ["a"])
    with pytest.raises(ValueError, match=r"^no questions to evaluate: the QA split is empty$"):
        qa_metrics([], [], [], ["a"])
    with pytest.raises(ValueError, match="collide"):
        qa_metrics(["a"], ["a"], ["in_vocab"], ["a"])


def test_baselines_chance_and_majority() -> None:
    from vlp.eval.qa import majority_answer, qa_baselines

    assert majority_answer(["Red", "blue", "red ", "blue", "green"]) == "blue"  # tie: alphabetical, normalised
    gold = ["red", "red", "blue", "zebra"]  # "zebra" is outside the vocabulary
    out = qa_baselines(gold, ["red", "blue", "green"], "red")
    assert out == {"chance_accuracy": 3 / 4 / 3, "majority_accuracy": 2 / 4}
    assert qa_baselines(gold, ["red", "blue"], "zebra")["majority_accuracy"] == 0.0  # a guess it cannot make
    with pytest.raises(ValueError, match=r"^no answers to take the majority of$"):
        majority_answer([])
    with pytest.raises(ValueError, match=r"^no answers to take the majority of$"):
        majority_answer(["", "  "])  # blank answers are no answers
    message = "^baselines need at least one gold answer and a non-empty vocabulary$"
    for gold, vocab in (([], ["red"]), (["red"], [])):
        with pytest.raises(ValueError, match=message):
            qa_baselines(gold, vocab, "red")
