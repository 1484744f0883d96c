"""Language: the captions and question/answer pairs that describe one item, drawn from its own generator."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vlp.data import manifest
from vlp.data.synth.plan import Entity, ItemPlan
from vlp.data.synth.world import (
    _COUNT_WORDS,
    DIRECTION_PHRASES,
    SCENE_PHRASES,
    SCENE_PREPS,
    SHAPE_SYNONYMS,
    SIZE_PHRASES,
)

# --------------------------------------------------------------------------- text


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _shape_word(rng: np.random.Generator, shape: str) -> str:
    """The canonical noun most of the time (so it dominates mined nouns), else a synonym."""
    synonyms = SHAPE_SYNONYMS[shape]
    return synonyms[0] if len(synonyms) == 1 or rng.random() < 0.7 else _pick(rng, synonyms[1:])


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _noun_phrase(rng: np.random.Generator, ent: Entity, color_mention: float = 1.0) -> str:
    words = [_pick(rng, SIZE_PHRASES[ent.size])] if rng.random() < 0.5 else []
    if color_mention >= 1.0 or rng.random() < color_mention:  # no draw at 1.0: default worlds stay byte-identical
        words.append(ent.color)
    return _with_article(" ".join([*words, _shape_word(rng, ent.shape)]))


def _join(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


_VERBS: tuple[tuple[str, str], ...] = (
    ("moves", "moving"),
    ("slides", "sliding"),
    ("drifts", "drifting"),
    ("glides", "gliding"),
)
_VERBS += (("travels", "travelling"), ("is moving", "moving"), ("is heading", "heading"), ("floats", "floating"))
_STILL_VERBS = (("sits", "rests", "lies", "is placed"), ("sit", "rest", "lie", "are placed", "appear"))  # (1, many)
_OPENERS = ("", "a video of ", "a clip showing ", "footage of ", "we see ", "you can see ")
_STILL_OPENERS = ("", "a picture of ", "a photo showing ", "an image of ", "we see ")


def _clauses(rng: np.random.Generator, plan: ItemPlan, participle: bool, color_mention: float) -> list[str]:
    """One clause per entity: '<noun phrase> <verb> <direction>' (stills: the noun phrase alone)."""
    out = []
    for ent in plan.entities:
        noun = _noun_phrase(rng, ent, color_mention)
        if not ent.direction:
            out.append(noun)
            continue
        finite, ing = _VERBS[int(rng.integers(len(_VERBS)))]
        out.append(f"{noun} {ing if participle else finite} {_pick(rng, DIRECTION_PHRASES[ent.direction])}")
    return out


def _caption(rng: np.random.Generator, plan: ItemPlan, color_mention: float = 1.0) -> str:
    """One caption of ``plan`` from a randomly chosen template."""
    scene = _pick(rng, SCENE_PHRASES[plan.scene])
    where = f"{_pick(rng, SCENE_PREPS[plan.scene])} {scene}"
    template = int(rng.integers(4))
    openers = _OPENERS if plan.media == "video" else _STILL_OPENERS
    if template == 0 and plan.media == "image":  # "a red circle and a blue star rest on the grass"
        verb = _pick(rng, _STILL_VERBS[len(plan.entities) > 1])
        text = f"{_join(_clauses(rng, plan, False, color_mention))} {verb} {where}"
    elif template == 0:  # "a red circle moves to the left over the grass"
        text = f"{_join(_clauses(rng, plan, False, color_mention))} {where}"
    elif template == 1:  # "a grassy field with a red circle moving to the left"
        text = f"{scene} with {_join(_clauses(rng, plan, True, color_mention))}"
    elif template == 2:  # "two shapes over the sand: a red circle moving left and ..."
        k = len(plan.entities)
        noun = _pick(rng, ("shape", "object")) + ("s" if k > 1 else "")
        count = "a single" if k == 1 else _COUNT_WORDS[k]
        text = f"{count} {noun} {where}: {_join(_clauses(rng, plan, True, color_mention))}"
    else:  # "a video of a red circle moving to the left across the grass"
        text = f"{_pick(rng, openers)}{_join(_clauses(rng, plan, True, color_mention))} {where}"
    return text[0].upper() + text[1:] + "."


def captions_for(plan: ItemPlan, n: int, rng: np.random.Generator, color_mention: float = 1.0) -> list[str]:
    """``n`` captions of ``plan``, distinct where the templates allow (up to 50 draws per caption).

    Each noun phrase names its object's colour with probability ``color_mention`` (1.0: always). Below
    1.0 some captions say only "a triangle", as real captions leave attributes out. docs/results/pem.md measures
    what it changes for the prompter (at CPU scale: nothing; the scene, not the captions, held it back).
    """
    seen: list[str] = []
    for _ in range(50 * n):
        text = _caption(rng, plan, color_mention)
        if text not in seen:
            seen.append(text)
        if len(seen) == n:
            return seen
    return seen + [seen[i % len(seen)] for i in range(n - len(seen))]  # repeats only if templates run out


_QUESTIONS: dict[str, tuple[str, ...]] = {
    "color": ("what colour is the {shape}?", "what color is the {shape}?", "which colour does the {shape} have?"),
    "shape": ("what shape is the {color} object?", "what is the {color} thing?", "which shape is {color}?"),
    "direction": (
        "which direction does the {ref} move?",
        "where is the {ref} heading?",
        "in which direction is the {ref} moving?",
        "which way does the {ref} go?",
    ),
    "count": ("how many objects are there?", "how many shapes can be seen?", "what is the number of shapes?"),
    "scene": ("what is the background?", "where are the shapes?", "what is behind the objects?", "what scene is this?"),
}


def questions_for(plan: ItemPlan, n: int, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """``n`` (question, answer, answer_type) triples cycling through the answer types in random order."""
    types = [t for t in manifest.ANSWER_TYPES if plan.media == "video" or t != "direction"]
    order: list[str] = []
    while len(order) < n:
        order += [types[int(i)] for i in rng.permutation(len(types))]
    out = []
    for kind in order[:n]:
        ent = plan.entities[int(rng.integers(len(plan.entities)))]
        shape = _shape_word(rng, ent.shape)
        ref = f"{ent.color} {shape}" if rng.random() < 0.5 else shape
        question = _pick(rng, _QUESTIONS[kind]).format(shape=shape, color=ent.color, ref=ref)
        answer = {
            "color": ent.color,
            "shape": ent.shape,
            "direction": ent.direction,
            "count": str(len(plan.entities)),
            "scene": plan.scene,
        }[kind]
        out.append((question[0].upper() + question[1:], answer, kind))
    return out
