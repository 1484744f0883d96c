"""Training pairs from stored frames: sampling, temporally consistent augmentation, determinism."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vlp.data.video_text import ClipRandAugment, VideoTextDataset, collate_video_text
from vlp.models.alpro.spec import RANDAUG

ALPRO_OPS = dict(RANDAUG)["alpro"]  # the default family's RandAugment ops


@pytest.fixture(scope="module")
def train_set(tiny_world):
    return VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], split="train", num_frames=4, mode="rand")


def test_items_are_normalised_clips_with_their_caption(train_set, tiny_world):
    item = train_set[0]
    assert item["video"].shape == (4, 3, 32, 32) and item["video"].dtype == torch.float32
    assert float(item["video"].min()) >= -1.0 and float(item["video"].max()) <= 1.0  # (x - 0.5) / 0.5
    video_id, caption = train_set.pairs[0]
    assert (item["video_id"], item["text"]) == (video_id, caption)
    raw = train_set.store.load(video_id)  # (k, H, W, 3) uint8, all stored frames
    as_pixels = ((item["video"] * 0.5 + 0.5) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for frame in as_pixels:  # every sampled frame is one of the stored frames (no augmentation here)
        assert any(np.abs(frame.astype(int) - r.astype(int)).max() <= 1 for r in raw)


def test_same_seed_epoch_index_gives_the_same_item_and_epochs_differ(tiny_world):
    a = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], num_frames=4, mode="rand", seed=7)
    b = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], num_frames=4, mode="rand", seed=7)
    clips = [i for i, (v, _) in enumerate(a.pairs) if a.media[v] == "video"]
    assert all(torch.equal(a[i]["video"], b[i]["video"]) for i in clips[:5])
    first = [a[i]["video"] for i in clips]
    a.set_epoch(1)
    assert any(not torch.equal(x, a[i]["video"]) for x, i in zip(first, clips, strict=True)), "rand never resampled"


def test_stills_repeat_into_static_clips(train_set):
    i = next(i for i, (v, _) in enumerate(train_set.pairs) if train_set.media[v] == "image")
    video = train_set[i]["video"]
    assert all(torch.equal(video[0], video[t]) for t in range(1, 4))


def test_augmentation_is_the_same_on_every_frame_and_restores_global_rng():
    rng = np.random.default_rng(0)
    frame = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    aug = ClipRandAugment(ALPRO_OPS, num_ops=2, magnitude=9)
    random.seed(123)
    np.random.seed(123)
    expected_py, expected_np = random.random(), np.random.rand()
    random.seed(123)
    np.random.seed(123)
    changed = 0
    for seed in range(20):
        out = [np.asarray(f) for f in aug([frame, frame, frame], seed=seed)]
        assert all(np.array_equal(out[0], o) for o in out[1:]), "frames of one clip got different ops"
        changed += not np.array_equal(out[0], np.asarray(frame))
    assert changed >= 10, "RandAugment at magnitude 9 should change most clips"
    assert (random.random(), np.random.rand()) == (expected_py, expected_np), "global RNG state leaked"


def test_randaugment_is_timms_without_importing_timms_package():
    """timm's RandAugment module loaded from its file on its own (:func:`timm_auto_augment`) gives the images the
    package's module gives for every seed, and loading it imports neither timm's package nor torch._dynamo."""
    code = ("import sys; from vlp.data.video_text import ClipRandAugment, timm_auto_augment; "
            "from vlp.models.alpro.spec import RANDAUG; ClipRandAugment(dict(RANDAUG)['alpro']); "
            "print(timm_auto_augment().__name__, [m for m in ('timm', 'torch._dynamo') if m in sys.modules])"
            )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "vlp_timm_auto_augment []"
    from timm.data.auto_augment import rand_augment_transform

    rng = np.random.default_rng(1)
    frame = Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    ours = ClipRandAugment(ALPRO_OPS, num_ops=2, magnitude=7)
    theirs = rand_augment_transform("rand-m7-n2", transforms=list(ALPRO_OPS))
    assert type(ours.transform).__module__ == "vlp_timm_auto_augment" != type(theirs).__module__
    changed = 0
    for seed in range(30):
        random.seed(seed)
        np.random.seed(seed)
        want = np.asarray(theirs(frame))
        got = np.asarray(ours([frame], seed=seed)[0])
        assert np.array_equal(got, want), seed
        changed += not np.array_equal(got, np.asarray(frame))
    assert changed >= 15


def test_augmented_dataset_is_deterministic(tiny_world):
    kw = dict(num_frames=4, mode="rand", augment=ClipRandAugment(ALPRO_OPS), seed=3)
    a = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], **kw)
    b = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], **kw)
    plain = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], num_frames=4, mode="rand", seed=3)
    assert all(torch.equal(a[i]["video"], b[i]["video"]) for i in range(6))
    assert any(not torch.equal(a[i]["video"], plain[i]["video"]) for i in range(6)), "augmentation did nothing"


def test_collate_and_errors(train_set, tiny_world):
    batch = collate_video_text([train_set[0], train_set[1]])
    assert batch["video"].shape == (2, 4, 3, 32, 32) and len(batch["text"]) == 2
    assert batch["index"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="sampling mode"):
        VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], mode="random")
    with pytest.raises(ValueError, match="no \\(clip, caption\\) pairs"):
        VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], split="nonexistent")


def test_size_resizes_clips_to_the_model_input(tiny_world):
    data = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], num_frames=2, mode="uniform", size=16)
    full = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], num_frames=2, mode="uniform")
    small, big = data[0]["video"], full[0]["video"]
    assert small.shape == (2, 3, 16, 16)
    # resizing commutes with the per-channel affine normalisation, so it equals resizing the full item
    expected = torch.nn.functional.interpolate(big, size=(16, 16), mode="bilinear", antialias=True)
    assert torch.allclose(small, expected, atol=1e-5)
    assert not torch.allclose(small, big[..., ::2, ::2], atol=1e-2), "must filter, not subsample"


def test_random_resized_boxes_follow_scale_and_ratio_and_the_seed():
    from vlp.data.video_text import random_resized_box

    rng = np.random.default_rng(0)
    boxes = [random_resized_box(60, 80, (0.2, 1.0), rng) for _ in range(200)]
    for top, left, h, w in boxes:
        assert 0 <= top <= 60 - h and 0 <= left <= 80 - w
        assert 0.2 - 0.03 <= h * w / (60 * 80) <= 1.0 and 3 / 4 - 0.1 <= w / h <= 4 / 3 + 0.1
    assert len(set(boxes)) > 150  # they vary
    again = np.random.default_rng(0)
    assert boxes[:5] == [random_resized_box(60, 80, (0.2, 1.0), again) for _ in range(5)]
    assert random_resized_box(10, 100, (0.99, 1.0), np.random.default_rng(1)) == (0, 43, 10, 13)  # too wide: centre


def test_crop_and_flip_are_one_draw_per_clip(tiny_world):
    kw = dict(num_frames=4, mode="uniform", seed=3)
    plain = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], **kw)
    flipped = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], hflip=True, **kw)
    flips = 0
    for i in range(12):
        a, b = plain[i]["video"], flipped[i]["video"]
        assert torch.equal(a, b) or torch.equal(a.flip(-1), b)  # every frame flipped, or none
        flips += not torch.equal(a, b)
    assert 0 < flips < 12
    cropped = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], crop_scale=(0.2, 0.3), size=32, **kw)
    again = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], crop_scale=(0.2, 0.3), size=32, **kw)
    assert all(torch.equal(cropped[i]["video"], again[i]["video"]) for i in range(4))  # same seed, same crop
    first = cropped[0]["video"]
    assert first.shape == plain[0]["video"].shape and not torch.equal(first, plain[0]["video"])
    with pytest.raises(ValueError, match="crop_scale"):
        VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], crop_scale=(0.5,))


def test_randaug_op_lists_are_timm_ops():
    from vlp.models.family import randaug_presets

    presets = randaug_presets()
    assert {"alpro", "albef_paper", "albef_code"} <= presets.keys()
    assert not {"AutoContrast", "Equalize", "Brightness", "Sharpness", "Contrast"} & set(presets["albef_paper"])
    for name, ops in presets.items():
        ClipRandAugment(ops=ops)  # timm refuses an unknown op name
        assert ops, name
    assert presets["alpro"] == ALPRO_OPS
    with pytest.raises(ValueError, match=r"^RandAugment needs at least one op$"):
        ClipRandAugment(ops=())


def test_albefs_caption_cleaning(tiny_world):
    from vlp.data.video_text import clean_caption

    kw = dict(num_frames=2, mode="uniform")
    raw = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], **kw)
    cleaned = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], caption_clean=True, **kw)
    assert [cleaned[i]["text"] for i in range(5)] == [clean_caption(raw[i]["text"]) for i in range(5)]

    assert clean_caption("A man's dog, running -- on the beach/sand!  ") == "a mans dog running on the beach sand"
    assert clean_caption(" ".join(f"w{i}" for i in range(40))) == " ".join(f"w{i}" for i in range(30))
    assert clean_caption("one two three", max_words=2) == "one two"


# --------------------------------------------------------------------------- damaged clips


def damaged_copy(tiny_world: dict, tmp_path, victims: int) -> tuple[str, list[str]]:
    """A copy of the tiny world's frames whose first ``victims`` train clips have every JPEG zeroed in place (the
    same size: the shard's footer still holds); returns the copy and the damaged clip ids."""
    import shutil

    from vlp.data.frames import FrameStore

    frames = str(tmp_path / "frames")
    shutil.copytree(tiny_world["frames"], frames)
    store = FrameStore(frames)
    pairs = VideoTextDataset(frames, tiny_world["dataset"], split="train", num_frames=2).pairs
    chosen = list(dict.fromkeys(v for v, _ in pairs))[:victims]
    for video_id in chosen:
        path = tmp_path / "frames" / store.info(video_id)["shard"]
        data = path.read_bytes()
        for jpeg in store.rows(video_id, ["jpeg"]).column("jpeg").to_pylist():
            data = data.replace(jpeg, b"\0" * len(jpeg))
        path.write_bytes(data)
    return frames, chosen


def test_a_damaged_clip_is_skipped_counted_and_replaced_by_the_next_pair(tiny_world, tmp_path, caplog):
    from vlp.data.loader import BatchIndices, ResumableSampler, SamplerBatches

    frames, (bad,) = damaged_copy(tiny_world, tmp_path, 1)
    data = VideoTextDataset(frames, tiny_world["dataset"], num_frames=2, mode="uniform", max_bad_share=0.5)
    first = next(i for i, (v, _) in enumerate(data.pairs) if v == bad)
    following = next(i for i in range(first + 1, len(data.pairs)) if data.pairs[i][0] != bad)
    with caplog.at_level("WARNING"):
        item = data[first]
    assert item["video_id"] == data.pairs[following][0] and item["index"] == following
    assert data.skipped == 1 and "damaged clip" in caplog.text and bad in caplog.text

    def fetch(indices: BatchIndices) -> list[str]:
        return [data[i]["video_id"] for i in indices]

    for workers in (0, 2):  # the count is shared with forked loader workers
        data = VideoTextDataset(frames, tiny_world["dataset"], num_frames=2, mode="uniform", max_bad_share=0.5)
        batches = SamplerBatches(ResumableSampler(len(data), seed=0, rank=0, world_size=1), fetch, 4,
                                 num_workers=workers)  # fmt: skip
        seen = [v for batch in batches for v in batch]
        batches.close()
        assert bad not in seen and data.skipped == sum(v == bad for v, _ in data.pairs[: len(seen)])


def test_more_damaged_clips_than_allowed_fail_naming_the_shards(tiny_world, tmp_path):
    from vlp.data.frames import CorruptClipError

    frames, bad = damaged_copy(tiny_world, tmp_path, 2)
    data = VideoTextDataset(frames, tiny_world["dataset"], num_frames=2, mode="uniform", max_bad_share=0.01)
    with pytest.raises(CorruptClipError, match=r"of \d+ clips drawn were damaged.*shards/shard-\d+-\w+\.parquet"):
        for i in range(len(data)):  # six of the epoch's draws are skipped: the epoch's last draw fails
            data[i]
    assert data.skipped == sum(v in bad for v, _ in data.pairs)
    strict = VideoTextDataset(frames, tiny_world["dataset"], num_frames=2, mode="uniform")  # evaluation: 0
    index = next(i for i, (v, _) in enumerate(strict.pairs) if v == bad[0])
    with pytest.raises(CorruptClipError, match=f"video '{bad[0]}'"):
        strict[index]


def test_training_batches_draw_new_frames_each_epoch_with_and_without_workers(tiny_world):
    """The steps' batches set the dataset's epoch, in whichever process builds them: an item's frames and
    augmentation change from one epoch to the next, and are the same with loader workers as without."""
    from vlp.data.loader import training_batches
    from vlp.data.video_text import collate_video_text
    from vlp.settings import PretrainConfig

    def epochs(workers: int) -> list[dict[int, torch.Tensor]]:
        data = VideoTextDataset(tiny_world["frames"], tiny_world["dataset"], num_frames=2, mode="rand",
                                augment=ClipRandAugment(ALPRO_OPS))  # fmt: skip

        def fetch(indices):
            return collate_video_text([data[i] for i in indices])

        batches = training_batches(PretrainConfig(num_workers=workers, seed=3), data, fetch, 4)
        seen = [{int(i): v for b in batches for i, v in zip(b["index"], b["video"], strict=True)} for _ in range(2)]
        batches.close()
        return seen

    serial, parallel = epochs(0), epochs(2)
    assert all(torch.equal(serial[e][i], parallel[e][i]) for e in (0, 1) for i in serial[e])
    common = set(serial[0]) & set(serial[1])
    changed = sum(not torch.equal(serial[0][i], serial[1][i]) for i in common)  # without the epoch: none
    assert changed > len(common) / 2, (changed, len(common))  # stills and untouched draws may repeat
