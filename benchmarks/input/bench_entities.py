"""Benchmark: caption noun mining with the lean spaCy pipeline vs plain ``nlp.pipe`` with every pipe.

Usage::

    .venv/bin/python benchmarks/input/bench_entities.py [--num-captions 4000] [--batch-size 256] [--repeats 2]

Generates realistic, mostly distinct video captions (templated: people/animals/objects doing things
in places, with camera words and the odd proper noun), then measures captions/s of

(a) ``spacy.load(model)`` with all its default pipes (tok2vec, tagger, parser, attribute_ruler,
    lemmatizer, ner) and ``nlp.pipe``, nouns then taken as ``token.pos_ == "NOUN"`` lemmas;
(b) vlp's mining path, :func:`vlp.data.entities.count_noun_lemmas` over
    :func:`vlp.data.entities.load_pipeline` (parser, NER and senter excluded).

It checks that both give identical noun counts (exit status 1 if not) and prints the speedup
(goal: >= 2x). Model loading is not timed; each pipeline is warmed up on a few captions first.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter

import spacy

from vlp.data.entities import count_noun_lemmas, load_pipeline, resolve_model_name

SUBJECTS = [
    "a man", "a woman", "an old man", "a young girl", "two boys", "a group of children", "a dog", "two dogs",
    "a cat", "a horse", "a chef", "a couple", "a cyclist", "people", "a surfer", "a farmer", "tourists",
    "a businessman", "a little puppy", "three ducks", "a teenager", "a doctor", "workers", "a bird",
]  # fmt: skip
VERBS = [
    "walks along", "runs across", "sits on", "plays with", "looks at", "stands near", "rides", "holds",
    "throws", "jumps over", "cooks", "carries", "paints", "cleans", "opens", "watches", "climbs", "eats",
]  # fmt: skip
OBJECTS = [
    "the beach", "a bicycle", "a red ball", "the table", "a wooden fence", "boxes", "the kitchen", "a guitar",
    "a laptop", "the river", "a bowl of soup", "the stairs", "a tree", "flowers", "the window", "a car",
    "an umbrella", "the mountains", "a sandwich", "glasses", "a phone", "the door", "leaves", "the snow",
    "a canvas", "the floor", "a boat", "apples", "a kite", "the fridge", "bottles", "a newspaper",
]  # fmt: skip
PLACES = [
    "in the park", "at sunset", "in a busy street", "on a sunny day", "in the forest", "near the lake",
    "in a small village", "at the office", "in the rain", "on the farm", "in Paris", "in New York",
    "at Christmas", "in the garden", "under the bridge", "at night", "in a modern city", "on the shore",
]  # fmt: skip
PREFIXES = ["", "", "", "Close-up of ", "Aerial view of ", "Slow motion footage: ", "Video of ", "Time lapse, "]
SUFFIXES = ["", "", ".", ".", " while the camera pans.", " in the background.", ", 4k footage.", " with friends."]


def make_captions(n: int, seed: int = 0) -> list[str]:
    """``n`` templated captions (mostly distinct) from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        clause = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}"
        if rng.random() < 0.3:
            clause += f" and {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        text = rng.choice(PREFIXES) + clause + rng.choice(SUFFIXES)
        out.append(text[0].upper() + text[1:])
    return out


def full_pipeline_nouns(nlp: spacy.language.Language, texts: list[str], batch_size: int) -> Counter[str]:
    """The straightforward way: every pipe, every caption, nouns read off ``pos_``/``lemma_``."""
    counts: Counter[str] = Counter()
    for doc in nlp.pipe(texts, batch_size=batch_size):
        counts.update(t.lemma_.lower() for t in doc if t.pos_ == "NOUN")
    return counts


def timed(fn, repeats: int) -> tuple[float, Counter[str]]:
    """Best wall time over ``repeats`` calls of ``fn`` and its (last) result."""
    best, result = float("inf"), Counter()
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 when the noun counts agree."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-captions", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="auto", help="spaCy model (default: auto)")
    args = parser.parse_args(argv)

    texts = make_captions(args.num_captions)
    model = resolve_model_name(args.model)
    full = spacy.load(model)
    lean = load_pipeline(args.model)
    print(f"model {model}; {len(texts)} captions ({len(set(texts))} distinct); batch_size {args.batch_size}")
    print(f"full pipes: {full.pipe_names}\nlean pipes: {lean.pipe_names}")
    full_pipeline_nouns(full, texts[:64], args.batch_size)  # warm-up
    count_noun_lemmas(lean, texts[:64], batch_size=args.batch_size)

    t_full, nouns_full = timed(lambda: full_pipeline_nouns(full, texts, args.batch_size), args.repeats)
    t_lean, nouns_lean = timed(lambda: count_noun_lemmas(lean, texts, batch_size=args.batch_size), args.repeats)
    rate_full, rate_lean = len(texts) / t_full, len(texts) / t_lean
    print(f"(a) full nlp.pipe : {t_full:7.2f} s  {rate_full:8.0f} captions/s")
    print(f"(b) vlp mining    : {t_lean:7.2f} s  {rate_lean:8.0f} captions/s")
    print(f"speedup {rate_lean / rate_full:.2f}x (goal >= 2x)")
    same = nouns_full == nouns_lean
    print(f"noun counts identical: {same} ({len(nouns_full)} distinct nouns, {sum(nouns_full.values())} tokens)")
    if not same:
        diff = (nouns_full - nouns_lean) + (nouns_lean - nouns_full)
        print(f"differences: {dict(diff.most_common(20))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
