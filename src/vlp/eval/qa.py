"""Open-ended video QA as classification over an answer vocabulary: the vocabulary and the accuracy metrics.

Answers are normalised with :func:`normalize_answer` (``strip()`` then ``lower()``, nothing else: no article
or punctuation removal) everywhere: when the vocabulary is built, and for predictions and gold answers when
they are compared. A question whose gold answer is outside the vocabulary cannot be answered by the classifier;
it is counted as wrong in ``accuracy`` (the denominator is every test question) and reported separately
through ``oov_rate`` and ``acc_in_vocab``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["OOV", "UNSEEN", "answer_type_map", "build_answer_vocab", "normalize_answer", "qa_metrics"]

OOV = "oov"  # confusion column: the gold answer is outside the vocabulary (unanswerable, counted wrong)
UNSEEN = "unseen"  # confusion column: the predicted answer never occurs as a gold answer, so it has no type
_RESERVED_TYPES = ("in_vocab",)  # would collide with the acc_in_vocab key


def normalize_answer(answer: str) -> str:
    """``answer.strip().lower()``: the only normalisation applied to answers."""
    return str(answer).strip().lower()


def build_answer_vocab(answers: Iterable[str], size: int = 1500) -> list[str]:
    """The ``size`` most frequent normalised answers (the released ALPRO code keeps 1,500).

    Args:
        answers: training answers, one per question (repeats count); normalised with :func:`normalize_answer`,
            and answers that are empty after normalisation are skipped.
        size: most answers to keep, ``>= 1``.

    Returns:
        Answers sorted by count, most frequent first; equal counts in alphabetical order. Shorter than
        ``size`` when there are fewer distinct answers.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"answer vocabulary size must be an int >= 1, got {size!r}")
    counts = Counter(a for a in map(normalize_answer, answers) if a)
    return [a for a, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]


def answer_type_map(answers: Iterable[str], answer_types: Iterable[str]) -> dict[str, str]:
    """Map each normalised answer to the answer type it occurs under most often (ties: alphabetical type).

    Used to give a *predicted* answer a type in the confusion table; build it from the gold data (the default
    of :func:`qa_metrics`) or from the training split.
    """
    by_answer: dict[str, Counter[str]] = defaultdict(Counter)
    for answer, kind in zip(answers, answer_types, strict=True):
        by_answer[normalize_answer(answer)][kind] += 1
    return {a: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for a, c in by_answer.items()}


def _check_lengths(predictions: Sequence[str], answers: Sequence[str], answer_types: Sequence[str]) -> None:
    if not len(predictions) == len(answers) == len(answer_types):
        raise ValueError(
            f"predictions, answers and answer_types must have one entry per question, got lengths "
            f"{len(predictions)}, {len(answers)}, {len(answer_types)}"
        )
    if not answers:
        raise ValueError("no questions to evaluate: the QA split is empty")
    clash = sorted(set(answer_types) & set(_RESERVED_TYPES))
    if clash:
        raise ValueError(f"answer type(s) {clash} collide with metric names; rename them before evaluating")


def majority_answer(answers: Iterable[str]) -> str:
    """The most frequent normalised answer (ties: alphabetical), the majority-answer baseline's constant guess."""
    vocab = build_answer_vocab(answers, 1)
    if not vocab:
        raise ValueError("no answers to take the majority of")
    return vocab[0]


def qa_baselines(answers: Sequence[str], vocab: Iterable[str], majority: str) -> dict[str, float]:
    """What trivial predictors score on these gold ``answers``: the level a QA model must beat.

    Returns:
        ``chance_accuracy``: a uniformly random answer from the classifier's ``vocab`` (in-vocabulary share /
        vocabulary size); ``majority_accuracy``: always answering ``majority`` (the most frequent training
        answer). Fractions in [0, 1].
    """
    vocab_set = {normalize_answer(a) for a in vocab}
    gold = [normalize_answer(a) for a in answers]
    if not gold or not vocab_set:
        raise ValueError("baselines need at least one gold answer and a non-empty vocabulary")
    in_vocab = sum(g in vocab_set for g in gold)
    guess = normalize_answer(majority)
    return {
        "chance_accuracy": in_vocab / len(gold) / len(vocab_set),
        "majority_accuracy": sum(g == guess for g in gold) / len(gold) if guess in vocab_set else 0.0,
    }


def qa_metrics(
    predictions: Sequence[str],
    answers: Sequence[str],
    answer_types: Sequence[str],
    vocab: Iterable[str],
    type_of: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Accuracy overall, per answer type and on in-vocabulary questions, with a confusion by answer type.

    A question is correct when its normalised gold answer is in ``vocab`` and equals the normalised prediction;
    out-of-vocabulary (OOV) gold answers are always wrong.

    Args:
        predictions: predicted answer per question (normally a vocabulary entry).
        answers: gold answer per question.
        answer_types: answer type per question (e.g. ``color``, ``what``); used as given, not normalised.
        vocab: the classifier's answer vocabulary (normalised on the way in).
        type_of: normalised answer -> answer type, to type the predictions; default
            ``answer_type_map(answers, answer_types)`` (the type each answer most often has in this gold data).

    Returns:
        Floats ``accuracy``, ``acc_in_vocab`` (0.0 when no question is in the vocabulary), ``oov_rate`` and one
        ``acc_<type>`` per answer type (fractions in [0, 1]); ints ``n``, ``n_oov``; and ``confusion``:
        ``{gold type: {column: count}}`` where the column is ``"oov"`` when the gold answer is outside the
        vocabulary, else the predicted answer's type, or ``"unseen"`` when the prediction never occurs as a gold
        answer (``"other"`` is avoided because importers use it as a real answer type). Each row sums to the
        number of questions of that type.
    """
    _check_lengths(predictions, answers, answer_types)
    vocab_set = {normalize_answer(a) for a in vocab}
    gold = [normalize_answer(a) for a in answers]
    pred = [normalize_answer(p) for p in predictions]
    in_vocab = [g in vocab_set for g in gold]
    correct = [iv and p == g for iv, p, g in zip(in_vocab, pred, gold, strict=True)]
    type_of = answer_type_map(gold, answer_types) if type_of is None else type_of

    n, n_iv = len(gold), sum(in_vocab)
    out: dict[str, Any] = {
        "accuracy": sum(correct) / n,
        "acc_in_vocab": sum(c for c, iv in zip(correct, in_vocab, strict=True) if iv) / n_iv if n_iv else 0.0,
        "oov_rate": (n - n_iv) / n,
        "n": n,
        "n_oov": n - n_iv,
    }
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for kind, ok, iv, p in zip(answer_types, correct, in_vocab, pred, strict=True):
        total[kind] += 1
        right[kind] += ok
        confusion[kind][type_of.get(p, UNSEEN) if iv else OOV] += 1
    out.update({f"acc_{kind}": right[kind] / total[kind] for kind in sorted(total)})
    out["confusion"] = {kind: dict(sorted(confusion[kind].items())) for kind in sorted(confusion)}
    return out
