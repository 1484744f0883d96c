"""Entity vocabulary mining: real spaCy model, real Parquet manifests, real S3 server (moto)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from vlp import storage
from vlp.data import entities, manifest
from vlp.data.entities import EntitiesConfig, EntitiesError

TRAIN = [
    "Two dogs are playing with boxes in the park.",
    "A dog jumps over a fence.",
    "Children feed the ducks near the lake.",
    "A man in a red shirt rides a horse in Paris.",
    "Close-up video footage of a cat sleeping on a sofa.",
    "A woman stands in front of a car.",
    "The mice hide under 3 boxes.",
    "Two dogs are playing with boxes in the park.",  # a duplicate counts twice
]
VAL = ["A zebra eats grass."]
TEST = ["A giraffe eats leaves."]

# Nouns of TRAIN, lemmatised and lowercased; video/footage (stop-list), front (stop word), Paris (PROPN) dropped.
EXPECTED = [
    ("box", 3), ("dog", 3), ("park", 2), ("car", 1), ("cat", 1), ("child", 1), ("duck", 1), ("fence", 1),
    ("horse", 1), ("lake", 1), ("man", 1), ("mouse", 1), ("shirt", 1), ("sofa", 1), ("woman", 1),
]  # fmt: skip


@pytest.fixture(scope="module")
def nlp():
    """The lean pipeline, loaded once (load_pipeline is cached, so mine() reuses it)."""
    return entities.load_pipeline("auto")


def caption_table() -> pa.Table:
    rows = [
        {"video_id": f"v{i}", "caption_id": f"{split}{i}", "caption": text, "split": split}
        for split, texts in (("train", TRAIN), ("val", VAL), ("test", TEST))
        for i, text in enumerate(texts)
    ]
    return manifest.from_rows(rows, manifest.CAPTION_SCHEMA)


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    root = str(tmp_path / "dataset")
    manifest.write(root, manifest.CAPTIONS, caption_table(), manifest.CAPTION_SCHEMA)
    return root


def cfg(**kw) -> EntitiesConfig:
    return EntitiesConfig(**{"min_count": 1, **kw})


def alpro_read(text: str, num_entities: int) -> list[str]:
    """What ALPRO's setup_text_prompts does: split lines, keep num_entities, first space-separated token."""
    return [line.split(" ")[0] for line in text.split("\n")[:num_entities]]


def test_lean_pipeline_runs_only_what_pos_and_lemmas_need(nlp):
    assert nlp.pipe_names == ["tok2vec", "tagger", "attribute_ruler", "lemmatizer"]
    assert entities.load_pipeline("auto") is nlp  # cached: mine() does not reload
    assert entities.model_label(nlp).startswith("en_core_web_sm")


def test_count_noun_lemmas_lemmatises_and_weights_duplicates(nlp):
    counts = entities.count_noun_lemmas(
        nlp, ["Two dogs carry boxes.", "The mice chase a dog.", "Two dogs carry boxes."]
    )
    assert counts == Counter({"dog": 3, "box": 2, "mouse": 1})


def test_count_noun_lemmas_proper_nouns_only_when_asked(nlp):
    text = ["A man walks in Paris."]
    assert entities.count_noun_lemmas(nlp, text) == Counter({"man": 1})
    assert entities.count_noun_lemmas(nlp, text, pos=["NOUN", "PROPN"]) == Counter({"man": 1, "paris": 1})
    with pytest.raises(EntitiesError, match="unknown coarse POS"):
        entities.count_noun_lemmas(nlp, text, pos=["NOUNS"])


def test_select_entities_filters_cuts_and_breaks_ties_alphabetically():
    counts = Counter({"dog": 5, "cat": 5, "bird": 5, "video": 9, "x": 7, "t-shirt": 6, "ox": 1, "tree": 2, "the": 8})
    got = entities.select_entities(counts, cfg(stop_nouns=["VIDEO"]), stop_words={"the"})
    assert got == [("bird", 5), ("cat", 5), ("dog", 5), ("tree", 2), ("ox", 1)]
    assert entities.select_entities(counts, cfg(stop_nouns=["video"], top_m=2), ["the"]) == [("bird", 5), ("cat", 5)]
    assert entities.select_entities(counts, cfg(stop_nouns=[], min_count=3, min_len=4), ["the"]) == [
        ("video", 9),
        ("bird", 5),
    ]


def test_mine_writes_exact_vocabulary_from_train_captions(nlp, dataset, tmp_path):
    out = str(tmp_path / "vocab")
    summary = entities.mine(dataset, out, cfg())
    assert summary["num_captions"] == len(TRAIN) and summary["num_unique_captions"] == len(TRAIN) - 1
    assert summary["num_kept"] == len(EXPECTED)
    assert summary["top10"] == [list(e) for e in EXPECTED[:10]]
    assert entities.read_entities(out) == EXPECTED  # no zebra (val) or giraffe (test): no leakage
    table = storage.read_parquet(storage.join(out, "entities.parquet"))
    assert table.schema.equals(entities.ENTITY_SCHEMA)
    assert table["rank"].to_pylist() == list(range(1, len(EXPECTED) + 1))
    doc = json.loads(storage.read_text(storage.join(out, "entities.json")))
    assert doc["entities"] == [list(e) for e in EXPECTED]
    assert doc["num_captions"] == len(TRAIN) and doc["model"] == summary["model"]


def test_unigrams_txt_is_what_alpro_reads(dataset, tmp_path):
    out = str(tmp_path / "vocab")
    entities.mine(dataset, out, cfg())
    text = storage.read_text(storage.join(out, "unigrams.txt"))
    assert text.split("\n")[:3] == ["box 3", "dog 3", "park 2"]
    words = [e for e, _ in EXPECTED]
    assert alpro_read(text, len(EXPECTED)) == words
    assert alpro_read(text, 1000) == words  # a larger num_entities yields no empty entity


def test_mine_respects_splits_stop_list_and_top_m(dataset, tmp_path):
    everything = entities.mine(dataset, str(tmp_path / "a"), cfg(splits=["train", "val", "test"], stop_nouns=[]))
    assert everything["num_captions"] == len(TRAIN) + len(VAL) + len(TEST)
    got = dict(entities.read_entities(str(tmp_path / "a")))
    assert {"zebra", "giraffe", "video", "footage"} <= got.keys() and "front" not in got  # spaCy stop word
    entities.mine(dataset, str(tmp_path / "b"), cfg(top_m=3, stop_nouns=["dog", "car"]))
    assert entities.read_entities(str(tmp_path / "b")) == [("box", 3), ("park", 2), ("cat", 1)]


def test_mine_is_deterministic(dataset, tmp_path):
    for name in ("a", "b"):
        entities.mine(dataset, str(tmp_path / name), cfg(batch_size=3))
    for name in ("entities.parquet", "entities.json", "unigrams.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_mine_reads_and_writes_s3(nlp, s3_bucket):
    ds, out = f"{s3_bucket}/dataset", f"{s3_bucket}/runs/1/entities"
    manifest.write(ds, manifest.CAPTIONS, caption_table(), manifest.CAPTION_SCHEMA)
    summary = entities.mine(ds, out, cfg())
    assert summary["outputs"]["unigrams.txt"] == f"{out}/unigrams.txt"
    assert storage.list_files(out) == [f"{out}/{n}" for n in ("entities.json", "entities.parquet", "unigrams.txt")]
    assert entities.read_entities(out) == EXPECTED
    assert alpro_read(storage.read_text(f"{out}/unigrams.txt"), 1000) == [e for e, _ in EXPECTED]


def test_unknown_model_is_a_clear_error(dataset, tmp_path):
    with pytest.raises(EntitiesError, match=r"'en_core_web_nope' is neither an installed.*spacy_model=auto"):
        entities.mine(dataset, str(tmp_path / "out"), cfg(spacy_model="en_core_web_nope"))
    assert not (tmp_path / "out").exists()


def test_bad_inputs_are_clear_errors(dataset, tmp_path):
    with pytest.raises(EntitiesError, match=r"splits=\['trian'\]"):
        entities.mine(dataset, str(tmp_path / "o"), cfg(splits=["trian"]))
    with pytest.raises(EntitiesError, match="top_m=0"):
        entities.mine(dataset, str(tmp_path / "o"), cfg(top_m=0))
    only_train = str(tmp_path / "only_train")
    rows = caption_table().filter(pa.compute.equal(caption_table()["split"], "train"))
    manifest.write(only_train, manifest.CAPTIONS, rows, manifest.CAPTION_SCHEMA)
    with pytest.raises(EntitiesError, match=r"no captions in splits \['val'\].*\['train'\]"):
        entities.mine(only_train, str(tmp_path / "o"), cfg(splits=["val"]))
    with pytest.raises(EntitiesError, match="no noun survived"):
        entities.mine(dataset, str(tmp_path / "o"), cfg(min_count=100))
    with pytest.raises(manifest.ManifestError, match="does not exist"):
        entities.mine(str(tmp_path / "nowhere"), str(tmp_path / "o"), cfg())


def test_config_section_loads_strictly():
    from vlp.config import ConfigError, load_config

    loaded = load_config(None, ["entities.top_m=5", "entities.pos=[NOUN, PROPN]", "entities.stop_nouns=[video]"])
    assert (loaded.entities.top_m, loaded.entities.pos, loaded.entities.stop_nouns) == (5, ["NOUN", "PROPN"], ["video"])
    assert "footage" in EntitiesConfig().stop_nouns and EntitiesConfig().splits == ["train"]
    with pytest.raises(ConfigError, match=r"entities\.top_k"):
        load_config(None, ["entities.top_k=5"])


def test_cli_mine_entities(dataset, tmp_path, capsys):
    from vlp.cli import main

    out = str(tmp_path / "cli")
    assert main(["mine-entities", "--dataset", dataset, "--out", out, "entities.min_count=1", "entities.top_m=2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["top10"] == [["box", 3], ["dog", 3]] and printed["step"] == "mine_entities"
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["num_kept"] == 2
    assert (tmp_path / "cli" / "unigrams.txt").read_text() == "box 3\ndog 3"
    assert main(["mine-entities", "--dataset", dataset, "--out", out, "entities.spacy_model=nope"]) == 2


def test_worker_processes_give_the_same_counts(nlp):
    texts = TRAIN * 3 + ["A zebra eats grass beside the snorfblats."]
    assert "snorfblat" not in nlp.vocab.strings  # a lemma string only a worker process will create
    multi = entities.count_noun_lemmas(nlp, texts, batch_size=2, n_process=2)
    assert multi == entities.count_noun_lemmas(nlp, texts, batch_size=2)
    assert multi["snorfblat"] == 1 and multi["dog"] == 9
