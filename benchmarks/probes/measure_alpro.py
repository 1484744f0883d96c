"""Measure what pre-training learned, on the synthetic world's test split (a script that prints numbers).

(a) Zero-shot text->video R@1 from the dual encoder's contrastive similarity, for a trained model
    (a ``pretrain-prompter`` or ``pretrain`` output) and for an untrained one of the same shape.
(b) Attribute swap tests: how often the prompter scores a test caption above the same caption with one
    object's shape (or colour) word swapped for one the clip does not hold; 50% = the attribute is not used.
(c) PEM pseudo-label accuracy against the ground truth: random PEM boxes on test clips; for boxes
    that hold at least half of an object's box (on the clip's middle stored frame), how often the
    prompter's top-1 entity names that object (its shape, a caption synonym of it, or its colour);
    separately, how often it names the clip's scene. Baseline: always the most frequent entity.

    python benchmarks/probes/measure_alpro.py --dataset runs/local/dataset --frames runs/local/frames \\
        --prompter runs/local/prompter --bank runs/local/prompt_bank [--model runs/local/alpro]
"""

from __future__ import annotations

import argparse
import re

import torch

from vlp import losses
from vlp.data import manifest
from vlp.data.synth import COLORS, SCENE_PHRASES, SHAPE_SYNONYMS
from vlp.data.video_text import VideoTextDataset, collate_video_text
from vlp.models import directory
from vlp.models.alpro.model import Alpro, DualEncoder
from vlp.models.alpro.prompts import PromptBank


def load_dual(out: str, trained: bool) -> tuple[DualEncoder, int]:
    """The dual encoder of a prompter or ALPRO output (random init of the same shape when not ``trained``)."""
    info = directory.describe(out, ("prompter", "alpro"))
    torch.manual_seed(0)
    model = info.load() if trained else info.build()
    dual = model.dual if isinstance(model, Alpro) else model
    return dual.eval(), info.config.video.img_size


@torch.no_grad()
def recall_at_1(dual: DualEncoder, data: VideoTextDataset, tokenizer) -> float:
    videos = sorted({v for v, _ in data.pairs})
    first = {v: next(i for i, (w, _) in enumerate(data.pairs) if w == v) for v in videos}
    vfeat = torch.cat([dual.encode_video(collate_video_text([data[first[v]]])["video"])[0] for v in videos])
    texts = [t for _, t in data.pairs]
    enc = tokenizer(texts, padding=True, truncation=True, max_length=30, return_tensors="pt")
    tfeat = dual.encode_text(enc["input_ids"], enc["attention_mask"])[0]
    best = (tfeat @ vfeat.t()).argmax(dim=1)  # (num_texts,)
    truth = torch.tensor([videos.index(v) for v, _ in data.pairs])
    return float((best == truth).float().mean())


@torch.no_grad()
def swap_tests(dual: DualEncoder, data: VideoTextDataset, tokenizer, boxes: list[dict]) -> dict[str, tuple[int, int]]:
    """How often a clip's caption scores above the same caption with one attribute word swapped (chance: 50%).

    For every test caption naming an object of its clip, its shape noun (canonical or synonym) is replaced by
    a shape the clip does not hold, or its colour by a colour the clip does not hold; the dual encoder should
    prefer the true caption. Returns ``{"shape": (wins, n), "colour": (wins, n)}``.
    """
    objects: dict[str, list[dict]] = {}
    for row in boxes:
        if row["frame_index"] == 0:
            objects.setdefault(row["video_id"], []).append(row)
    gen = torch.Generator().manual_seed(1)
    tally = {"shape": [0, 0], "colour": [0, 0]}
    feats: dict[str, torch.Tensor] = {}

    def pick(options: list[str]) -> str:
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    for video_id, caption in data.pairs:
        objs = objects.get(video_id, [])
        if not objs:
            continue
        if video_id not in feats:
            item = data[next(i for i, (w, _) in enumerate(data.pairs) if w == video_id)]
            feats[video_id] = dual.encode_video(item["video"][None])[0][0]
        text = caption.lower()
        obj = objs[int(torch.randint(len(objs), (1,), generator=gen))]
        swaps = []
        noun = next((w for w in SHAPE_SYNONYMS[obj["shape"]] if re.search(rf"\b{w}\b", text)), None)
        if noun:
            other = pick([s for s in SHAPE_SYNONYMS if s not in {o["shape"] for o in objs}])
            swaps.append(("shape", re.sub(rf"\b{noun}\b", other, text, count=1)))
        if re.search(rf"\b{obj['color']}\b", text):
            other = pick([c for c in COLORS if c not in {o["color"] for o in objs}])
            swaps.append(("colour", re.sub(rf"\b{obj['color']}\b", other, text, count=1)))
        for kind, swapped in swaps:
            enc = tokenizer([text, swapped], padding=True, truncation=True, max_length=30, return_tensors="pt")
            score = dual.encode_text(enc["input_ids"], enc["attention_mask"])[0] @ feats[video_id]
            tally[kind][0] += int(score[0] > score[1])
            tally[kind][1] += 1
    return {kind: (wins, n) for kind, (wins, n) in tally.items()}


def object_words(shape: str, color: str) -> set[str]:
    return {w for phrase in SHAPE_SYNONYMS[shape] for w in phrase.split()} | {color}


def scene_words(scene: str) -> set[str]:
    return {w for phrase in (scene, *SCENE_PHRASES[scene]) for w in phrase.split()} - {"the", "a", "an", "of"}


def _object_vocab(bank: PromptBank) -> list[int]:
    """Indices of the bank's entities that name some object (a shape, a caption synonym of one, a colour)."""
    words = set().union(*(object_words(shape, color) for shape in SHAPE_SYNONYMS for color in COLORS))
    return [i for i, e in enumerate(bank.entities) if e in words]


def _centred_box(obj: dict, size: int, patch: int, area: float) -> torch.Tensor:
    """A patch-aligned square ``[top, left, h, w]`` of ``area`` of the frame centred on ``obj`` (inside the frame)."""
    side = max(patch, round((area**0.5) * size / patch) * patch)
    cy, cx = (obj["y0"] + obj["y1"]) / 2 * size, (obj["x0"] + obj["x1"]) / 2 * size
    top = min(max(0, round((cy - side / 2) / patch) * patch), size - side)
    left = min(max(0, round((cx - side / 2) / patch) * patch), size - side)
    return torch.tensor([[top, left, side, side]])


class _Tally:
    """Hits of the prompter and of a constant baseline, per measure."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, name: str, hit: bool, base: bool) -> None:
        c = self.counts.setdefault(name, [0, 0, 0])
        c[0], c[1], c[2] = c[0] + hit, c[1] + base, c[2] + 1


@torch.no_grad()
def pseudo_label_accuracy(args, prompter: DualEncoder, size: int, bank: PromptBank, data: VideoTextDataset) -> _Tally:
    """Four measures (see the module docstring); each against a constant most-frequent-entity baseline."""
    boxes = manifest.read(args.dataset, manifest.BOXES, manifest.BOX_SCHEMA).to_pylist()
    by_frame: dict[tuple[str, int], list[dict]] = {}
    for row in boxes:
        by_frame.setdefault((row["video_id"], row["frame_index"]), []).append(row)
    scenes = {}
    for row in manifest.read(args.dataset, manifest.CAPTIONS, manifest.CAPTION_SCHEMA).to_pylist():
        for scene, phrases in SCENE_PHRASES.items():
            if any(p in row["caption"] for p in phrases):
                scenes.setdefault(row["video_id"], scene)
    gen = torch.Generator().manual_seed(0)
    tally = _Tally()
    objects = _object_vocab(bank)
    top_entity, top_object = bank.entities[0], bank.entities[objects[0]]
    patch = prompter.video.config.patch_size
    grid = size // patch

    def scores(video: torch.Tensor, pixel_box: torch.Tensor) -> torch.Tensor:
        feat = prompter.encode_video(losses.entity.crop_frames(video, pixel_box))[0]
        return losses.pseudo_labels(feat, bank.video, prompter.temperature())[0]  # (M,)

    for video_id in sorted({v for v, _ in data.pairs if data.media[v] == "video"}):
        item = data[next(i for i, (w, _) in enumerate(data.pairs) if w == video_id)]
        video = item["video"][None]  # (1, T, 3, S, S), S = the model's img_size (the dataset resizes)
        middle = data.store.rows(video_id)["frame_index"].to_pylist()[data.store.info(video_id)["num_stored"] // 2]
        truth = by_frame.get((video_id, middle), [])
        for _ in range(args.crops):
            pem = losses.sample_pem_boxes(1, grid, grid, patch_size=patch, generator=gen)
            pseudo = scores(video, pem.pixel_boxes)
            top = bank.entities[int(pseudo.argmax())]
            top_, left, h, w = (int(x) / size for x in pem.pixel_boxes[0])
            inside = [o for o in truth if _covered(o, top_, left, h, w) >= 0.5]
            if inside:
                words = set().union(*(object_words(o["shape"], o["color"]) for o in inside))
                tally.add("random crop, top-1 of all entities names an object in it", top in words, top_entity in words)
                top_obj = bank.entities[objects[int(pseudo[objects].argmax())]]
                tally.add("random crop, top-1 of object entities names an object in it", top_obj in words,
                          top_object in words)  # fmt: skip
            if video_id in scenes:
                words = scene_words(scenes[video_id])
                tally.add("random crop, top-1 of all entities names the scene", top in words, top_entity in words)
        for obj in truth:  # a 30%-of-frame box centred on each object
            pseudo = scores(video, _centred_box(obj, size, patch, 0.3))
            words = object_words(obj["shape"], obj["color"])
            top = bank.entities[int(pseudo.argmax())]
            tally.add("object-centred crop, top-1 of all entities names it", top in words, top_entity in words)
            top_obj = bank.entities[objects[int(pseudo[objects].argmax())]]
            tally.add("object-centred crop, top-1 of object entities names it", top_obj in words, top_object in words)
    return tally


def _covered(obj: dict, top: float, left: float, h: float, w: float) -> float:
    """Share of the object's box inside the crop (normalised coordinates)."""
    ix = max(0.0, min(obj["x1"], left + w) - max(obj["x0"], left))
    iy = max(0.0, min(obj["y1"], top + h) - max(obj["y0"], top))
    area = max(1e-9, (obj["x1"] - obj["x0"]) * (obj["y1"] - obj["y0"]))
    return ix * iy / area


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--frames", required=True)
    parser.add_argument("--prompter", required=True)
    parser.add_argument("--bank", required=True)
    parser.add_argument("--model", default="", help="a pretrain output (default: measure the prompter only)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num-frames", type=int, default=4)
    parser.add_argument("--crops", type=int, default=4, help="PEM boxes per test clip")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    tok = directory.describe(args.prompter).tokenizer()
    prompter, size = load_dual(args.prompter, True)
    data = VideoTextDataset(
        args.frames, args.dataset, split=args.split, num_frames=args.num_frames, mode="uniform", size=size
    )
    print(f"{args.split}: {len({v for v, _ in data.pairs})} clips/stills, {len(data.pairs)} captions")
    for name, out in [("prompter", args.prompter)] + ([("alpro", args.model)] if args.model else []):
        for trained in (False, True):
            dual, model_size = load_dual(out, trained)
            if model_size != size:
                raise SystemExit(f"{out} takes {model_size} px frames, the prompter {size} px: measure them apart")
            r1 = recall_at_1(dual, data, tok)
            print(f"zero-shot t2v R@1  {name:8s} {'trained' if trained else 'untrained':9s}: {100 * r1:5.1f}%")
    print(f"chance R@1: {100 / len({v for v, _ in data.pairs}):.1f}%")
    boxes = manifest.read(args.dataset, manifest.BOXES, manifest.BOX_SCHEMA).to_pylist()
    for kind, (wins, n) in swap_tests(prompter, data, tok, boxes).items():
        share = 100 * wins / max(n, 1)
        print(f"prompter: the true caption beats the {kind}-swapped one {share:5.1f}% of {n} times (chance 50%)")
    bank = PromptBank.load(args.bank)
    tally = pseudo_label_accuracy(args, prompter, size, bank, data)
    objects = _object_vocab(bank)
    print(f"baselines: most frequent entity '{bank.entities[0]}', most frequent object entity "
          f"'{bank.entities[objects[0]]}' ({len(objects)} of {len(bank.entities)} entities name objects)")  # fmt: skip
    print(f"{'pseudo-label measure':62s} {'prompter':>9s} {'baseline':>9s} {'n':>5s}")
    for name, (hits, base, n) in tally.counts.items():
        print(f"{name:62s} {100 * hits / n:8.1f}% {100 * base / n:8.1f}% {n:5d}")


if __name__ == "__main__":
    main()
