"""``vlp index`` and ``vlp search`` (issue 26, slice 1) on the tiny world, with real models (random init) of each
family: a search scores a query as evaluate-retrieval does; indexing is incremental; another model, other frames
or another sampling is refused; the CLI prints a table and JSON; the index works on S3."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from conftest import split_rows
from vlp import storage
from vlp.cli import main
from vlp.config import Config, load_config
from vlp.data import manifest
from vlp.data.frames import FrameStore
from vlp.eval.retrieval import topk_rerank
from vlp.index.query import Searcher
from vlp.index.store import TABLE, ClipIndex
from vlp.inference import encode_clips, encode_texts, pair_scorer, text_length
from vlp.models import directory, family
from vlp.models.tokenizer import train_wordpiece
from vlp.settings import ModelConfig, RetrievalConfig
from vlp.steps.evaluate import evaluate_retrieval
from vlp.steps.finetune import retrieval_data
from vlp.steps.index import index_clips
from vlp.weights import save_model_weights

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
# every clip re-ranked in both evaluate-retrieval and search (>= the tiny world's 20 clips), loaders on this thread
FULL = ["retrieval.rerank_k=64", "index.candidates=64", "retrieval.num_workers=0"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


def config(*overrides: str) -> Config:
    return load_config(TINY, [*FULL, *overrides])


def captions(dataset: str, split: str = "test") -> list[str]:
    rows = manifest.read(dataset, manifest.CAPTIONS, manifest.CAPTION_SCHEMA).to_pylist()
    return [r["caption"] for r in rows if r["split"] == split]


def save_model(out: Path, name: str, tok: Any, seed: int = 0) -> str:
    """A randomly initialised retrieval model of family ``name`` saved as a model directory (tiny sizes)."""
    fam = family.get(name)
    section = ModelConfig(family=name, preset="tiny", img_size=32, num_frames=2, max_len=24, embed_dim=16)
    cfg = fam.config(section, len(tok), 4 if "bank" in family.spec(name).pretrain_inputs else 0)
    cfg = fam.prepare(fam.task_config(cfg, "retrieval", RetrievalConfig(num_frames=2, max_len=24)), 2, 4)
    torch.manual_seed(seed)
    model = fam.build(fam.kinds.retrieval, cfg)
    weights = save_model_weights(str(out / "weights"), model)
    directory.save(str(out), kind=fam.kinds.retrieval, config=cfg, checkpoint=weights, tokenizer=tok, steps=0)
    return str(out)


@pytest.fixture(scope="module")
def models(tiny_world, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("index_models")
    tok = train_wordpiece(captions(tiny_world["dataset"], "train"), vocab_size=300)
    made = {name: save_model(root / name, name, tok) for name in ("alpro", "ts2net", "albef")}
    made["alpro-other"] = save_model(root / "alpro-other", "alpro", tok, seed=1)
    return made


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory) -> dict[str, str]:
    """The tiny world with every caption in the test split: 20 clips to rank instead of the test split's 3."""
    root = tmp_path_factory.mktemp("all_test")
    for name in (manifest.VIDEOS, manifest.QA):
        shutil.copy(Path(tiny_world["dataset"], name), root)
    table = pq.read_table(Path(tiny_world["dataset"], manifest.CAPTIONS))
    split = table.schema.get_field_index("split")
    table = table.set_column(split, table.schema.field(split), pa.array(["test"] * table.num_rows))
    storage.write_parquet(str(root / manifest.CAPTIONS), table)
    return dict(tiny_world, dataset=str(root))


@pytest.fixture(scope="module")
def test_index(world, models, tmp_path_factory) -> dict[str, str]:
    """An index of the test split's clips per family (ALPRO's without its tokens)."""
    root = tmp_path_factory.mktemp("indexes")
    out = {}
    for name in ("alpro", "ts2net", "albef"):
        out[name] = str(root / name)
        extra = ["index.max_token_floats=0"] if name == "alpro" else []
        summary = index_clips(models[name], world["frames"], out[name], config(*extra), world["dataset"])
        assert summary["added"] == summary["total"] > 0 and summary["skipped"] == 0
        assert summary["tokens_stored"] is (name != "alpro")
    return out


def evaluate_row(world: dict[str, str], model: str, query: str, cfg: Config) -> dict[str, tuple[float, float]]:
    """What evaluate-retrieval computes for ``query`` over the clips of ``retrieval.split``: ``{video_id: (score,
    similarity)}``, through its own encoders and :func:`topk_rerank` over the whole set."""
    info = directory.describe(model)
    net, tok, fam = info.load("cpu"), info.tokenizer(), info.family
    rc = cfg.retrieval
    data = retrieval_data(cfg, world["dataset"], world["frames"], info.config, rc.split, training=False)
    ids = sorted({v for v, _ in data.pairs})
    videos = encode_clips(fam, net, data, ids, rc.eval_batch_size, cfg)
    text = encode_texts(fam, net, tok, [query], text_length(rc, info.config), rc.eval_batch_size, rc.eval_precision)
    sim = fam.similarity(net, text, videos)
    scores = sim
    if family.pair_scorer_of(fam, net) is not None:
        scores = topk_rerank(sim, rc.rerank_k, pair_scorer(fam, net, text, videos, rc.eval_precision),
                             rc.eval_batch_size, rule=rc.score_rule).scores  # fmt: skip
    return {v: (float(scores[0, i]), float(sim[0, i])) for i, v in enumerate(ids)}


@pytest.mark.parametrize("name", ["alpro", "ts2net", "albef"])
def test_search_scores_and_ranks_a_query_as_evaluate_retrieval_does(name, world, models, test_index, monkeypatch):
    cfg = config()
    searcher = Searcher(test_index[name], cfg)
    opened: list[str] = []  # frames stores opened (ALPRO's index keeps no tokens: its candidates are read again)
    real_init = FrameStore.__init__
    monkeypatch.setattr(
        FrameStore, "__init__", lambda self, out, *a, **k: opened.append(out) or real_init(self, out, *a, **k)
    )
    by_search = []

    def search(query: str, k: int) -> list:
        before = len(opened)
        hits = searcher.search(query, k=k)
        by_search.append(len(opened) - before)
        return hits

    assert (family.pair_scorer_of(searcher.fam, searcher.net) is None) is (name == "ts2net")
    for query in (captions(world["dataset"])[0], "a red star moving left over sand"):
        want = evaluate_row(world, models[name], query, cfg)
        hits = search(query, len(want))
        assert [h.rank for h in hits] == list(range(1, len(want) + 1))
        assert sorted(h.video_id for h in hits) == sorted(want)
        for h in hits:
            assert h.score == pytest.approx(want[h.video_id][0], abs=1e-5)
            assert h.similarity == pytest.approx(want[h.video_id][1], abs=1e-5)
        ranked = sorted(want, key=lambda v: -want[v][0])
        assert [h.video_id for h in hits] == ranked
        assert search(query, 2) == hits[:2]
    assert sum(by_search) == (name == "alpro")  # the frames store is opened once for all queries, not once a query


def test_the_ranking_matches_evaluate_retrievals_own_top5(world, models, test_index, tmp_path):
    """The real step's ranks.parquet: each caption's five best clips are search's first five."""
    cfg = config()
    evaluate_retrieval(world["dataset"], world["frames"], models["alpro"], str(tmp_path / "eval"), cfg)
    ranks = pq.read_table(tmp_path / "eval" / "ranks.parquet").to_pylist()
    searcher = Searcher(test_index["alpro"], cfg)
    for row in ranks[:4]:
        assert [h.video_id for h in searcher.search(row["text"], k=5)] == row["top5"]


def test_only_missing_clips_are_added_and_a_partial_index_is_completed(tiny_world, models, tmp_path):
    out, cfg = str(tmp_path / "index"), config()
    first = index_clips(models["ts2net"], tiny_world["frames"], out, cfg, tiny_world["dataset"], "test")
    everything = index_clips(models["ts2net"], tiny_world["frames"], out, cfg)  # every clip of the store
    store = FrameStore(tiny_world["frames"])
    assert everything["skipped"] == first["total"] and everything["total"] == len(store)
    assert everything["added"] == len(store) - first["total"] > 0
    again = index_clips(models["ts2net"], tiny_world["frames"], out, cfg)
    assert (again["added"], again["skipped"], again["total"]) == (0, len(store), len(store))
    index = ClipIndex.open(out)
    assert index.video_ids() == set(store.video_ids) and index.count() == len(store)
    # a clip encodes the same whether its split or the whole store was indexed
    split_only = str(tmp_path / "split_only")
    index_clips(models["ts2net"], tiny_world["frames"], split_only, cfg, tiny_world["dataset"])
    query = captions(tiny_world["dataset"])[1]
    full = {h.video_id: h.score for h in Searcher(out, cfg).search(query, k=len(store))}
    for h in Searcher(split_only, cfg).search(query, k=len(store)):
        assert h.score == pytest.approx(full[h.video_id], abs=1e-6)
    thumb = Image.open(io.BytesIO(index.thumbnail(store.video_ids[0])))
    assert thumb.format == "JPEG" and thumb.size == (32, 32)


def test_another_model_other_frames_or_another_sampling_is_refused(world, models, test_index, tmp_path):
    with pytest.raises(ValueError, match=r"was built by another model: .*alpro.*index into a new --out, or pass "):
        index_clips(models["alpro-other"], world["frames"], test_index["alpro"], config(), world["dataset"])
    with pytest.raises(ValueError, match=r"another model: .*ts2net.*--model .*alpro"):
        index_clips(models["alpro"], world["frames"], test_index["ts2net"], config(), world["dataset"])
    was = r"sampled its clips with retrieval\.num_frames=2, retrieval\.eval_mode=uniform; "
    with pytest.raises(ValueError, match=was + r"this config samples them with retrieval\.num_frames=1, "):
        index_clips(models["alpro"], world["frames"], test_index["alpro"], config("retrieval.num_frames=1"))
    copy = tmp_path / "frames-copy"  # the same clips, another store: the index reads its frames from one URI
    shutil.copytree(world["frames"], copy)
    with pytest.raises(ValueError, match=r"holds clips of the frames .*, not of --frames "):
        index_clips(models["alpro"], str(copy), test_index["alpro"], config())


def test_an_index_encoded_in_bf16_is_searched_in_bf16_and_takes_no_fp32_clips(world, models, tmp_path):
    """``retrieval.eval_precision=bf16``: the index records it, a search encodes its query (and, with no stored
    tokens, its candidates again) in it whatever the search's config says, so its scores are evaluate-retrieval's
    in bf16; clips encoded in fp32 are refused."""
    out, query = str(tmp_path / "index"), captions(world["dataset"])[0]
    bf16 = config("retrieval.eval_precision=bf16", "index.max_token_floats=0")
    index_clips(models["alpro"], world["frames"], out, bf16, world["dataset"])
    assert ClipIndex.open(out).info.sampling["precision"] == "bf16"
    want = evaluate_row(world, models["alpro"], query, bf16)
    fp32 = evaluate_row(world, models["alpro"], query, config())
    hits = Searcher(out, config()).search(query, k=len(want))  # an fp32 config: the index's precision wins
    assert sorted(h.video_id for h in hits) == sorted(want)
    for h in hits:
        assert h.score == pytest.approx(want[h.video_id][0], abs=1e-5)
        assert h.similarity == pytest.approx(want[h.video_id][1], abs=1e-5)
    assert any(want[v] != fp32[v] for v in want), "bf16 scored every clip as fp32 did (no autocast?)"
    assert max(abs(want[v][i] - fp32[v][i]) for v in want for i in (0, 1)) < 0.02
    refused = r"encoded its clips with retrieval\.eval_precision=bf16; this config encodes them with .*=fp32: set"
    with pytest.raises(ValueError, match=refused):
        index_clips(models["alpro"], world["frames"], out, config("index.max_token_floats=0"))


def test_search_refuses_a_model_directory_whose_weights_changed_since(world, models, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(models["alpro"], model)
    out = str(tmp_path / "index")
    index_clips(str(model), world["frames"], out, config(), world["dataset"])
    assert Searcher(out, config()).search("a green star", k=1)
    weights = "weights/model.safetensors"
    shutil.copy(Path(models["alpro-other"], weights), model / weights)  # retrained in place
    with pytest.raises(ValueError, match=r"holds other weights than the ones the index .* was built with: rebuild"):
        Searcher(out, config())
    shutil.rmtree(model)
    with pytest.raises(FileNotFoundError, match=r"model\.json does not exist"):
        Searcher(out, config())


def test_the_ann_index_finds_what_the_exact_scan_finds(tiny_world, models, tmp_path):
    out = str(tmp_path / "ann")
    summary = index_clips(models["albef"], tiny_world["frames"], out, config("index.ann_min_rows=8"))
    assert summary["ann"] and ClipIndex.open(out).has_ann()
    exact = str(tmp_path / "exact")
    index_clips(models["albef"], tiny_world["frames"], exact, config())
    assert not ClipIndex.open(exact).has_ann()
    query = captions(tiny_world["dataset"])[2]
    few = config("index.candidates=5", "retrieval.rerank_k=5")
    assert Searcher(out, few).search(query, k=5) == Searcher(exact, few).search(query, k=5)


def test_evaluating_the_train_split_reads_it_as_the_test_split_is_read(tiny_world, models, tmp_path):
    """retrieval.split=train (own-videos.md: a dataset with one split) evaluates with the eval sampler and no
    augmentation, whatever the training settings: the ranks are those of a config that augments nothing."""
    from vlp import storage

    split = ["retrieval.split=train"]
    augmenting = config(*split, "retrieval.randaug=true", "retrieval.hflip=true", "retrieval.crop_scale=[0.3,0.6]",
                        "retrieval.sample_mode=rand")  # fmt: skip
    plain = config(*split, "retrieval.randaug=false", "retrieval.hflip=false", "retrieval.sample_mode=uniform")
    ranks = []
    for name, cfg in (("augmenting", augmenting), ("plain", plain)):
        evaluate_retrieval(tiny_world["dataset"], tiny_world["frames"], models["ts2net"], str(tmp_path / name), cfg)
        ranks.append(storage.read_parquet(str(tmp_path / name / "ranks.parquet")).to_pylist())
    assert len(ranks[0]) == len(captions(tiny_world["dataset"], "train")) and ranks[0] == ranks[1]


def vectors(uri: str) -> dict[str, list[float]]:
    rows = ClipIndex.open(uri).table.search().select(["video_id", "vector"]).limit(None).to_arrow().to_pylist()
    return {row["video_id"]: row["vector"] for row in rows}


def test_clips_added_later_join_the_ann_index_or_rebuild_it_past_the_share(tiny_world, models, tmp_path):
    train = len({r["video_id"] for r in split_rows(tiny_world["dataset"], manifest.CAPTIONS, "train")})
    clips = len(FrameStore(tiny_world["frames"]))
    late = clips - train
    assert 0 < late / clips < 0.5  # the tiny world: a few clips are in no train caption
    ann = config("index.ann_min_rows=8", "index.ann_rebuild_share=0.5")
    grown = str(tmp_path / "grown")
    first = index_clips(models["albef"], tiny_world["frames"], grown, ann, tiny_world["dataset"], "train")
    assert (first["total"], first["ann_index"]) == (train, "built")
    second = index_clips(models["albef"], tiny_world["frames"], grown, ann)  # the whole store: the test clips too
    assert (second["added"], second["total"], second["ann_index"]) == (late, clips, "extended")
    assert ClipIndex.open(grown).unindexed_rows() == 0
    assert index_clips(models["albef"], tiny_world["frames"], grown, ann)["ann_index"] == "current"

    rebuilt = str(tmp_path / "rebuilt")
    share = config("index.ann_min_rows=8", f"index.ann_rebuild_share={late / clips}")  # the late rows reach it
    index_clips(models["albef"], tiny_world["frames"], rebuilt, share, tiny_world["dataset"], "train")
    assert index_clips(models["albef"], tiny_world["frames"], rebuilt, share)["ann_index"] == "built"
    assert ClipIndex.open(rebuilt).unindexed_rows() == 0

    exact = str(tmp_path / "exact")
    assert index_clips(models["albef"], tiny_world["frames"], exact, config())["ann_index"] is None
    # a clip indexed as part of the train split is encoded as the same clip read from the frames store alone: the
    # eval sampler, no training augmentation (the split's name does not make it a training read)
    assert vectors(grown) == vectors(exact)
    every = config(f"index.candidates={clips}", "retrieval.rerank_k=5")  # the first stage must reach every row
    for query in captions(tiny_world["dataset"])[:3]:
        want = Searcher(exact, every).search(query, k=clips)
        assert Searcher(grown, every).search(query, k=clips) == want == Searcher(rebuilt, every).search(query, k=clips)


def test_loader_workers_index_quietly_and_a_search_encodes_its_candidates_on_its_own_thread(
    tiny_world, world, models, test_index, tmp_path, monkeypatch
):
    workers = config("retrieval.num_workers=2")
    out = str(tmp_path / "index")
    first = index_clips(models["alpro"], tiny_world["frames"], out, config(), tiny_world["dataset"])  # test split
    # `vlp index` adds the rest with two loader workers, forked after it opened the index with LanceDB; in its own
    # process, since pytest records the warnings a forked worker of this one would print
    cmd = [sys.executable, "-m", "vlp.cli", "index", "--model", models["alpro"], "--frames", tiny_world["frames"],
           "--out", out, "--config", str(TINY), *FULL, "retrieval.num_workers=2"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["added"] == len(FrameStore(tiny_world["frames"])) - first["total"] > 0
    assert "fork support is experimental" not in done.stderr  # LanceDB's warning, from each worker

    # ALPRO's index stores no tokens: a search encodes its candidates again, with no loader workers to fork
    import vlp.data.loader

    def no_workers(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a search started loader workers")

    query = captions(world["dataset"])[1]
    want = Searcher(test_index["alpro"], config()).search(query, k=4)
    monkeypatch.setattr(vlp.data.loader, "DataLoader", no_workers)
    assert Searcher(test_index["alpro"], workers).search(query, k=4) == want


def test_a_run_that_looked_before_another_wrote_stores_no_clip_twice(tiny_world, models, tmp_path, monkeypatch):
    out = str(tmp_path / "index")
    clips = len(FrameStore(tiny_world["frames"]))
    assert index_clips(models["ts2net"], tiny_world["frames"], out, config())["added"] == clips
    # a second run that listed the index before the first made it: it makes the table and adds every clip again
    unseen = classmethod(lambda cls, uri: False)
    with monkeypatch.context() as m:
        m.setattr(ClipIndex, "exists", unseen)
        late = index_clips(models["ts2net"], tiny_world["frames"], out, config())
    assert (late["added"], late["skipped"], late["total"]) == (0, clips, clips)
    assert sorted(vectors(out)) == sorted(FrameStore(tiny_world["frames"]).video_ids)
    assert ClipIndex.open(out).count() == clips
    # ... and one with another model finds the first run's index when it makes the table: refused, nothing added
    with monkeypatch.context() as m, pytest.raises(ValueError, match="was built by another model"):
        m.setattr(ClipIndex, "exists", unseen)
        index_clips(models["albef"], tiny_world["frames"], out, config())
    assert ClipIndex.open(out).count() == clips


def test_cli_index_prints_its_summary_and_search_a_table_and_json(tiny_world, models, tmp_path, capsys):
    out = str(tmp_path / "index")
    args = ["--config", str(TINY), *FULL]
    assert main(["index", "--model", models["alpro"], "--frames", tiny_world["frames"], "--out", out, *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    clips = len(FrameStore(tiny_world["frames"]))
    assert summary["step"] == "index" and summary["added"] == summary["total"] == clips and summary["seconds"] > 0
    query = captions(tiny_world["dataset"])[0]
    assert main(["search", "--index", out, "-k", "3", *args[:2], query, *FULL]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["rank", "video_id", "score", "similarity"] and len(table) == 4
    assert [line.split()[0] for line in table[1:]] == ["1", "2", "3"]
    assert main(["search", "--index", out, "-k", "3", "--json", *args[:2], query, *FULL]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["rank"] for h in hits] == [1, 2, 3]
    assert [h["video_id"] for h in hits] == [line.split()[1] for line in table[1:]]  # the table's clips
    assert all(isinstance(h["score"], float) and isinstance(h["similarity"], float) for h in hits)
    assert main(["search", "--index", out, *args[:2], "  ", *FULL]) == 2
    assert capsys.readouterr().err.strip() == "vlp search: error: the query is empty: give the text to search for"
    for bad in ("0", "1001", "x"):
        with pytest.raises(SystemExit) as info:
            main(["search", "--index", out, "-k", bad, *args[:2], query, *FULL])
        assert info.value.code == 2 and "expected an integer in 1..1000" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "nothing"), *args[:2], query, *FULL]) == 2
    assert "holds no clip index: make one with `vlp index" in capsys.readouterr().err


def test_the_index_lives_on_s3(tiny_world, models, s3_bucket, s3_env, capsys):
    out, args = f"{s3_bucket}/index", ["--config", str(TINY), *FULL]
    cmd = ["index", "--model", models["ts2net"], "--frames", tiny_world["frames"], "--out", out,
           "--dataset", tiny_world["dataset"], "--split", "test", *args]  # fmt: skip
    assert main(cmd) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["added"] == first["total"] > 0
    assert main(cmd) == 0
    assert json.loads(capsys.readouterr().out)["added"] == 0
    query = captions(tiny_world["dataset"])[0]
    assert main(["search", "--index", out, "-k", "2", "--json", *args[:2], query, *FULL]) == 0
    hits = json.loads(capsys.readouterr().out)
    local = Searcher(out, config()).search(query, k=2)
    assert [h["video_id"] for h in hits] == [h.video_id for h in local]
    assert storage.exists(f"{out}/summary.json")
    missing = ["index", "--model", models["ts2net"], "--frames", tiny_world["frames"], "--out",
               "s3://vlp-no-such-bucket/index", *args]  # fmt: skip
    assert main(missing) == 1
    assert capsys.readouterr().err.startswith("vlp index: storage error: cannot list the index s3://vlp-no-such-bucket")


def test_the_storage_sections_endpoint_and_keys_reach_the_index(world, models, s3_config, s3_bucket, monkeypatch):
    """Without any AWS_* variable, the index reads the endpoint and keys of the storage section as vlp.storage does."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    cfg, out = config(), f"{s3_bucket}/keyed/index"
    cfg.storage = s3_config
    summary = index_clips(models["albef"], world["frames"], out, cfg, world["dataset"])
    assert summary["added"] == summary["total"] == ClipIndex.open(out).count() > 0
    assert len(Searcher(out, cfg).search("a blue square", k=3)) == 3
    assert any(key.startswith(f"keyed/index/{TABLE}.lance/") for key in _keys(s3_bucket))


def _keys(bucket: str) -> list[str]:
    name = bucket.removeprefix("s3://")
    return [obj["Key"] for obj in storage.client().list_objects_v2(Bucket=name).get("Contents", [])]


def test_object_store_options_follow_the_storage_section_then_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://env.example")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    try:
        storage.configure(storage.StorageConfig())
        assert storage.object_store_options() == {"aws_region": "eu-west-3", "aws_endpoint": "https://env.example",
                                                  "aws_virtual_hosted_style_request": "false"}  # fmt: skip
        keyed = storage.StorageConfig(endpoint_url="http://127.0.0.1:9000", region="r1", access_key_id="a",
                                      secret_access_key="s", addressing_style="virtual")  # fmt: skip
        storage.configure(keyed)
        assert storage.object_store_options() == {
            "aws_region": "r1", "aws_endpoint": "http://127.0.0.1:9000", "allow_http": "true",
            "aws_virtual_hosted_style_request": "true", "aws_access_key_id": "a", "aws_secret_access_key": "s",
        }  # fmt: skip
    finally:
        storage.configure(storage.StorageConfig())


def _link_out(inside: Path, outside: Path) -> Path:
    """Move the file ``inside`` to ``outside`` and leave a symbolic link to it in its place."""
    shutil.move(inside, outside)
    inside.symlink_to(outside)
    return inside


def test_a_link_in_a_frames_store_an_index_or_a_model_directory_is_refused(world, models, test_index, tmp_path,
                                                                          capsys):  # fmt: skip
    """A file of a store replaced by a symbolic link (to a real file of the same kind, outside): every reader
    refuses it in one line, naming the link, instead of reading through it."""
    frames, index, model = tmp_path / "frames", tmp_path / "index", tmp_path / "model"
    shutil.copytree(world["frames"], frames)
    shutil.copytree(test_index["ts2net"], index)
    shutil.copytree(models["alpro"], model)
    shard = _link_out(sorted((frames / "shards").iterdir())[0], tmp_path / "elsewhere.parquet")
    args = ["--config", str(TINY), *FULL]
    assert (
        main(["index", "--model", models["alpro"], "--frames", str(frames), "--out", str(tmp_path / "i"), *args]) == 2
    )
    said = f"the frames store {frames} holds a symbolic link, shards/{shard.name} -> {tmp_path}/elsewhere.parquet"
    assert capsys.readouterr().err == f"vlp index: error: {said}: vlp never writes one there, so it is refused " \
                                      "(replace it with the file itself)\n"  # fmt: skip
    assert not (tmp_path / "i").exists()
    data = sorted((index / "clips.lance" / "data").iterdir())[0]
    _link_out(data, tmp_path / data.name)
    assert main(["search", "--index", str(index), "--config", str(TINY), "a star", *FULL]) == 2
    assert capsys.readouterr().err.startswith(f"vlp search: error: the index {index} holds a symbolic link, "
                                              f"clips.lance/data/{data.name} -> ")  # fmt: skip
    weights = next(model.rglob("*.safetensors"))
    _link_out(weights, tmp_path / "weights.safetensors")
    with pytest.raises(storage.LinkError, match=f"the model directory {model} holds a symbolic link, "):
        directory.describe(str(model))
    (model / "tokenizer").rename(tmp_path / "tokenizer")
    (model / "tokenizer").symlink_to(tmp_path / "tokenizer")  # a directory linked in: refused as well
    weights.unlink()
    shutil.copy(tmp_path / "weights.safetensors", weights)
    with pytest.raises(storage.LinkError, match=r"holds a symbolic link, tokenizer -> "):
        directory.describe(str(model))
