"""KFP components of the toy family with a prepared input of its own (tests/test_toy_family.py): the step that
counts the training captions' words, and the toy's pre-training, which takes them as ``words``. Here, not in the
test module: KFP reads a component's annotations as types, which ``from __future__ import annotations`` would turn
into strings."""

import json

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

PRE = "toy_pre"
WORDS_FILE = "words.json"
IMAGE = "ghcr.io/vlp-ml/vlp:test"


def count_caption_words(dataset: str, out: str) -> dict:
    """The toy's preparation step: how often each word occurs in the training captions of ``dataset``, written as
    ``<out>/words.json``."""
    from vlp import storage
    from vlp.data import manifest

    counts: dict = {}
    for row in manifest.read(dataset, manifest.CAPTIONS, manifest.CAPTION_SCHEMA).to_pylist():
        if row["split"] == "train":
            for word in row["caption"].lower().split():
                counts[word] = counts.get(word, 0) + 1
    storage.write_text(storage.join(out, WORDS_FILE), json.dumps(counts, sort_keys=True))
    return counts


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def count_words(dataset: Input[Dataset], words: Output[Dataset], config: str, overrides: list, data_root: str = ""):
    from components._runtime import Step, location, output_location
    from toy_components import count_caption_words

    ds, out = location(dataset), output_location(words, data_root)
    Step("count_words", config, overrides).run(lambda cfg: {"words": len(count_caption_words(ds, out))})


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def toy_pretrain(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    words: Input[Dataset],
    model: Output[Model],
    config: str,
    overrides: list,
    family: str = PRE,
    data_root: str = "",
    nproc: int = 1,
    launch: dict = {},  # noqa: B006 (KFP reads the default; it is never mutated)
):
    from components._runtime import Step, location, output_location
    from vlp.steps.pretrain import pretrain

    ds, fr, wd, out = location(dataset), location(frames), location(words), output_location(model, data_root)
    step = Step("pretrain", config, [*overrides, f"model.family={family}"], nproc, launch)
    step.run(lambda cfg: pretrain(ds, fr, out, cfg, {"words": wd}))
