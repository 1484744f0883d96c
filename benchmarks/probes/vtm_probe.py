"""Why does ALPRO's VTM head stay at its label prior at CPU scale? A script that trains small models and prints tables.

In every CPU run of ``vlp pretrain`` / ``vlp finetune-retrieval`` the VTM loss sits at 0.635-0.637, the entropy
of its 1:2 label prior (one positive, two hard negatives per clip). This script separates the candidate causes
on a synthetic world built with the project's own steps (synth -> ingest -> extract-frames, tiny sizes):

1. **VTC stage.** A dual encoder (``DualEncoder``, the prompter's objective ``losses.vtc_loss``) is trained
   on the training split; held-out t2v / v2t R@1 is reported against chance (1 / test clips). Cached in
   ``<work>/vtc.safetensors``.
2. **VTM stages**, one per run spec, all started from that checkpoint (``Alpro`` with its ``dual`` loaded):
   the fusion layers + VTM head are trained with

   - ``neg=uniform``: negatives drawn uniformly from the batch (what hard negatives from an untrained
     similarity amount to), ``neg=hard``: ALPRO's ``losses.sample_hard_negatives`` on the VTC similarity,
     ``neg=hard_masked``: the same with same-clip pairs and same-content pairs (a caption that is true of the
     other clip: same scene and same shape / colour / direction set) removed from the sampling weights;
   - ``lr=``, ``steps=``, ``mlm=1`` (MLM on the fused text as well), ``init=text`` (fusion layer *i* starts
     from the trained text tower's layer *i*: a stand-in for ALPRO's BERT-initialised fusion),
     ``towers=train`` (towers trained too, with ``vtc=1`` VTC alongside; default ``towers=frozen``: the
     towers' tokens are computed once, 4 frame draws per training clip);
   - ``impl=library``: the whole model trained with ``vlp.models.alpro.model.alpro_step`` exactly as
     ``vlp pretrain`` (``terms=vtc+mlm+vtm``) or ``finetune-retrieval`` (``terms=vtc+vtm``) do.

   For each run, on the held-out test split (model in eval mode):

   - **losses**: VTM loss on 1:2 batches built as in training with library hard negatives (prior entropy
     0.6365), with masked hard negatives, with uniform negatives; the balanced 1:1 probe loss (ln 2 = 0.693;
     a head that only learnt the 1:2 prior scores 0.752 there);
   - **pair types**: for each test caption, its clip (positive), a clip of another scene, a clip of the same
     scene with other objects: mean p(match), accuracy at p > 0.5, and the ranking accuracy
     P(score(positive) > score(negative)) per negative type (chance 50%);
   - **retrieval**: t2v / v2t R@1 after ``vlp.eval.retrieval.topk_rerank`` (top-k of the VTC similarity
     re-scored by VTM, rules ``match`` and ``match_plus_sim``) beside the VTC-only R@1 and chance;
   - **attention**: in the first and the last fusion layer, the share of the fused text [CLS]'s attention
     (mean over heads) that goes to video tokens, at init and after training, beside the video tokens'
     share of the (unpadded) sequence;
   - **MLM** (runs with ``mlm=1``): held-out MLM loss / accuracy with the clip's own video, another scene's
     clip and no video at all (same masks): equal values mean MLM is solved from the text alone.

   Also printed: which kind of pair each negative sampler draws on training batches (same clip, same
   content, same scene, other scene).

Run (measured on 2 busy CPU cores: VTC stage 3-7 min, 1.5 min per frozen-tower run, 3-4 min per library
run; the default set about 25 min)::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/probes/vtm_probe.py --work /tmp/vtm-exp
    python benchmarks/probes/vtm_probe.py --work /tmp/vtm-exp --runs "uniform:neg=uniform" "hard:neg=hard,lr=1e-3"

A run spec is ``name:key=value,...`` (keys: impl, neg, lr, steps, mlm, init, towers, vtc, terms, batch, seed);
omitted keys take the defaults of ``--vtm-steps``, ``--vtm-lr``, ``--batch``. ``--runs`` without arguments
lists the default set. Everything is cached under ``--work`` (world, tokenizer, VTC weights) and reused when
the recipe matches; ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vlp import losses, storage
from vlp.config import Config, load_config
from vlp.data.sampling import sample_indices
from vlp.data.synth import plan_item
from vlp.data.video_text import VideoTextDataset
from vlp.eval import retrieval
from vlp.models.alpro.model import Alpro, DualEncoder, alpro_losses, alpro_step, vtm_logits
from vlp.models.family import PretrainBatch, StepContext, TextVocab
from vlp.models.tokenizer import load_tokenizer, save_tokenizer, train_wordpiece
from vlp.settings import ModelConfig
from vlp.steps.pretrain import model_config
from vlp.train.checkpoint import load_model_weights, save_model_weights
from vlp.train.optim import OptimConfig, build_optimizer, build_scheduler, clip_gradients

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

PRIOR_1_2 = -(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3))  # 0.6365: entropy of the 1:2 labels
LN2 = math.log(2)
PRIOR_ON_BALANCED = -(0.5 * math.log(1 / 3) + 0.5 * math.log(2 / 3))  # 0.752: a 1:2-prior head on a 1:1 probe
STORED_FRAMES = 8
TRAIN_DRAWS = 4  # frame draws per training clip whose tokens a frozen-tower run samples from
WORLD_JSON = "vtm_world.json"
NEGATIVES = ("uniform", "hard", "hard_masked", "mixed")
DEFAULT_RUNS = (
    "library_lr1e-4:impl=library,terms=vtc+mlm+vtm,lr=1e-4,steps=400",
    "library_lr1e-3:impl=library,terms=vtc+mlm+vtm,lr=1e-3,steps=400",
    "uniform:neg=uniform",
    "hard:neg=hard",
    "hard_masked:neg=hard_masked",
    "mixed:neg=mixed",
    "hard_masked_lr1e-4:neg=hard_masked,lr=1e-4",
    "hard_masked_lr3e-4:neg=hard_masked,lr=3e-4",
    "hard_masked_lr3e-3:neg=hard_masked,lr=3e-3",
    "hard_masked_textinit:neg=hard_masked,init=text",
    "hard_masked_mlm:neg=hard_masked,mlm=1",
)


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/vtm-exp", help="cache directory: world, tokenizer, VTC weights")
    p.add_argument("--num-videos", type=int, default=480, help="clips in the world (a quarter go to test)")
    p.add_argument("--test-fraction", type=float, default=0.25, help="synth.test_fraction (no val split)")
    p.add_argument("--captions", type=int, default=2, help="synth.captions_per_video")
    p.add_argument("--size", type=int, default=32, help="frame side in pixels (world and model)")
    p.add_argument("--world-seed", type=int, default=1009, help="synth.seed")
    p.add_argument("--num-frames", type=int, default=2, help="frames per clip given to the model")
    p.add_argument("--max-len", type=int, default=40, help="text tokens incl. [CLS]/[SEP]")
    p.add_argument("--vocab", type=int, default=400, help="WordPiece vocabulary size")
    p.add_argument("--batch", type=int, default=32, help="pairs per training batch (VTC and VTM)")
    p.add_argument("--vtc-steps", type=int, default=3000, help="updates of the VTC stage")
    p.add_argument("--vtc-lr", type=float, default=1e-3, help="peak lr of the VTC stage")
    p.add_argument("--vtm-steps", type=int, default=600, help="default updates of a VTM run")
    p.add_argument("--vtm-lr", type=float, default=1e-3, help="default peak lr of a VTM run")
    p.add_argument("--k", type=int, default=16, help="retrieval.rerank_k: VTC candidates VTM re-scores per query")
    p.add_argument("--seed", type=int, default=0, help="model / training seed")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    p.add_argument("--workers", type=int, default=2, help="processes of the world's synth, ingest and extract-frames")
    p.add_argument("--runs", nargs="*", default=None, help="run specs name:key=value,... (none given: list them)")
    p.add_argument("--json", default=None, help="also write every number to this JSON file")
    args = p.parse_args(argv)
    if args.runs == []:
        print("default runs:\n  " + "\n  ".join(DEFAULT_RUNS))
        raise SystemExit(0)
    args.runs = list(DEFAULT_RUNS) if args.runs is None else args.runs
    return args


@dataclass(frozen=True)
class RunSpec:
    """One VTM stage (see the module docstring for the keys)."""

    name: str
    impl: str = "probe"  # "probe" (this script's loop) | "library" (alpro_step)
    neg: str = "hard"  # uniform | hard | hard_masked
    lr: float = 1e-3
    steps: int = 1500
    mlm: bool = False
    init: str = "random"  # random | text
    towers: str = "frozen"  # frozen | train
    vtc: bool = False  # VTC alongside (towers=train only)
    terms: str = "vtc+mlm+vtm"  # impl=library: model.losses
    batch: int = 32
    seed: int = 0


def parse_spec(text: str, args: argparse.Namespace) -> RunSpec:
    """``name:key=value,...`` -> :class:`RunSpec` (unset keys from the command-line defaults)."""
    name, _, rest = text.partition(":")
    fields = {"lr": args.vtm_lr, "steps": args.vtm_steps, "batch": args.batch, "seed": args.seed}
    kinds = {f.name: f.type for f in dataclasses.fields(RunSpec)}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in kinds or key == "name":
            raise SystemExit(f"run spec {text!r}: unknown key {key!r}; use one of {sorted(set(kinds) - {'name'})}")
        kind = kinds[key]
        fields[key] = value in ("1", "true") if kind == "bool" else float(value) if kind == "float" else value
        if kind == "int":
            fields[key] = int(value)
    spec = RunSpec(name=name, **fields)
    if spec.neg not in NEGATIVES or spec.init not in ("random", "text"):
        raise SystemExit(f"run spec {text!r}: neg must be one of {'|'.join(NEGATIVES)}, init random|text")
    if spec.impl not in ("probe", "library") or spec.towers not in ("frozen", "train"):
        raise SystemExit(f"run spec {text!r}: impl must be probe|library, towers frozen|train")
    return spec


# --------------------------------------------------------------------------- world and data


def world_overrides(args: argparse.Namespace) -> list[str]:
    """Synth / ingest / frames overrides of the probe world (train + test splits, no val)."""
    return [
        f"synth.num_videos={args.num_videos}", "synth.num_images=0", f"synth.seed={args.world_seed}",
        f"synth.size={args.size}", "synth.min_duration_s=1.0", "synth.max_duration_s=2.0", "synth.min_fps=8",
        "synth.max_fps=8", f"synth.captions_per_video={args.captions}", "synth.qa_per_video=5",
        "synth.val_fraction=0", f"synth.test_fraction={args.test_fraction}", f"synth.workers={args.workers}",
        f"ingest.workers={args.workers}", "ingest.progress=false", f"frames.size={args.size}",
        f"frames.num_frames={STORED_FRAMES}", f"frames.workers={args.workers}", "frames.progress=false",
    ]  # fmt: skip


def ensure_world(args: argparse.Namespace) -> tuple[Config, str, str]:
    """``(config, dataset, frames)`` of the world in ``<work>/world``: reused when its recipe matches, else built."""
    cfg = load_config(None, world_overrides(args))
    recipe = {"overrides": world_overrides(args)}
    world = storage.join(args.work, "world")  # the tokenizer and VTC caches beside it belong to this world
    return cfg, *common.cached_world(world, cfg, recipe, WORLD_JSON, "pass another --work")


@dataclass
class Split:
    """One split in memory: stored frames per clip, captions, and what each clip shows."""

    clips: list[str]  # video ids
    frames: Tensor  # (V, STORED_FRAMES, 3, S, S) normalised
    texts: list[str]  # captions
    text_clip: Tensor  # (T,) clip index of each caption
    scene: Tensor  # (V,) scene id of each clip
    content: Tensor  # (V,) id of (scene, {(shape, colour, direction)}): equal = each one's captions fit the other


def load_split(cfg: Config, dataset: str, frames: str, split: str, size: int) -> Split:
    """Every clip of ``split`` (all stored frames), its captions, scene and content from the synth plan."""
    data = VideoTextDataset(frames, dataset, split=split, num_frames=STORED_FRAMES, mode="uniform", size=size)
    clips = sorted({v for v, _ in data.pairs})
    position = {v: i for i, v in enumerate(clips)}
    stack = torch.stack([data.clip(v, np.random.default_rng(0)) for v in clips])
    plans = [plan_item(cfg.synth, "video", int(v.rsplit("-", 1)[1])) for v in clips]
    scenes = sorted({p.scene for p in plans})
    contents: dict[Any, int] = {}
    for p in plans:
        contents.setdefault((p.scene, frozenset((e.shape, e.color, e.direction) for e in p.entities)), len(contents))
    content = [contents[(p.scene, frozenset((e.shape, e.color, e.direction) for e in p.entities))] for p in plans]
    return Split(
        clips=clips,
        frames=stack,
        texts=[t for _, t in data.pairs],
        text_clip=torch.tensor([position[v] for v, _ in data.pairs]),
        scene=torch.tensor([scenes.index(p.scene) for p in plans]),
        content=torch.tensor(content),
    )


def pick_frames(stored: Tensor, num_frames: int, mode: str, rng: np.random.Generator) -> Tensor:
    """``(B, STORED, 3, S, S)`` -> ``(B, num_frames, 3, S, S)`` with the ``vlp.data.sampling`` sampler."""
    return torch.stack([clip[sample_indices(clip.shape[0], num_frames, mode, rng)] for clip in stored])


def tokenize(tok: Any, texts: list[str], max_len: int) -> tuple[Tensor, Tensor]:
    enc = tok(texts, padding="max_length", truncation=True, max_length=max_len, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def ensure_tokenizer(args: argparse.Namespace, train: Split) -> Any:
    path = storage.join(args.work, f"tokenizer-v{args.vocab}")
    if not storage.exists(storage.join(path, "tokenizer.json")):
        save_tokenizer(train_wordpiece(train.texts, vocab_size=args.vocab, max_len=args.max_len), path)
    return load_tokenizer(path)


def alpro_config(args: argparse.Namespace, tok: Any, terms: list[str]) -> Any:
    """The tiny preset at the probe's sizes (``vlp.steps.pretrain.model_config``)."""
    model = ModelConfig(preset="tiny", img_size=args.size, num_frames=args.num_frames, max_len=args.max_len)
    model = dataclasses.replace(model, embed_dim=32, vocab_size=args.vocab, losses=terms)
    return model_config(model, len(tok), 0, terms)


def optimiser(model: torch.nn.Module, lr: float, steps: int) -> tuple[Any, Any]:
    """AdamW + linear warm-up (5%) and decay, the shared loop's settings (``vlp.train.optim``)."""
    cfg = OptimConfig(lr=lr, weight_decay=1e-3, warmup_ratio=0.05, grad_clip=20.0)
    opt = build_optimizer(model, cfg)
    return opt, build_scheduler(opt, cfg, steps)


class PairSampler:
    """Epochs of shuffled (clip, caption) pairs cut into batches, as ``ResumableSampler`` (drop last)."""

    def __init__(self, n: int, batch: int, seed: int) -> None:
        self.n, self.batch, self.rng, self.order = n, batch, np.random.default_rng(seed), np.zeros(0, dtype=int)

    def next(self) -> Tensor:
        if len(self.order) < self.batch:
            self.order = self.rng.permutation(self.n)
        out, self.order = self.order[: self.batch], self.order[self.batch :]
        return torch.from_numpy(out.copy())


# --------------------------------------------------------------------------- VTC stage


def ensure_vtc(args: argparse.Namespace, tok: Any, train: Split, test: Split) -> tuple[dict[str, Tensor], dict]:
    """The VTC-trained dual encoder's weights (cached) and its held-out retrieval figures."""
    cfg = alpro_config(args, tok, ["vtc"])
    recipe = {"steps": args.vtc_steps, "lr": args.vtc_lr, "batch": args.batch, "seed": args.seed,
              "num_frames": args.num_frames, "max_len": args.max_len, "vocab": args.vocab}  # fmt: skip
    weights, doc = storage.join(args.work, "vtc.safetensors"), storage.join(args.work, "vtc.json")
    torch.manual_seed(args.seed)
    dual = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=cfg.init_temp)
    if storage.exists(doc) and json.loads(storage.read_text(doc))["recipe"] == recipe:
        load_model_weights(weights, dual)
        return dual.state_dict(), json.loads(storage.read_text(doc))["metrics"]
    ids, mask = tokenize(tok, train.texts, args.max_len)
    opt, sched = optimiser(dual, args.vtc_lr, args.vtc_steps)
    sampler, rng, start, curve = PairSampler(len(train.texts), args.batch, args.seed), np.random.default_rng(1), 0, []
    start = time.perf_counter()
    dual.train()
    for step in range(1, args.vtc_steps + 1):
        idx = sampler.next()
        video = pick_frames(train.frames[train.text_clip[idx]], args.num_frames, "rand", rng)
        out = alpro_losses(dual(PretrainBatch(video, ids[idx], mask[idx])))
        out["loss"].backward()
        clip_gradients(dual.parameters(), 20.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        curve.append(float(out["loss_vtc"]))
        if step % 250 == 0 or step == args.vtc_steps:
            r = vtc_retrieval(dual, tok, test, args)
            temp = float(dual.temperature().detach())
            print(f"  vtc step {step}: loss {np.mean(curve[-250:]):.3f}, temp {temp:.3f}, "
                  f"held-out t2v R@1 {r['t2v_r1']:.1f} v2t R@1 {r['v2t_r1']:.1f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    metrics = vtc_retrieval(dual, tok, test, args) | {"train_loss_last250": float(np.mean(curve[-250:]))}
    metrics |= {"seconds": time.perf_counter() - start, "temp": float(dual.temperature().detach())}
    save_model_weights(weights, dual)
    storage.write_text(doc, json.dumps({"recipe": recipe, "metrics": metrics}, indent=2) + "\n")
    return dual.state_dict(), metrics


@torch.no_grad()
def encode(dual: DualEncoder, tok: Any, split: Split, args: argparse.Namespace, draws: int = 1) -> dict[str, Tensor]:
    """Eval-mode features and tokens: clips with ``draws`` frame draws (draw 0 uniform, then rand), captions."""
    was = dual.training
    dual.eval()
    rng = np.random.default_rng(7)
    vfeat, vtok = [], []
    for d in range(draws):
        video = pick_frames(split.frames, args.num_frames, "uniform" if d == 0 else "rand", rng)
        feats, toks = zip(*(dual.encode_video(video[i : i + 128]) for i in range(0, len(video), 128)), strict=True)
        vfeat.append(torch.cat(feats))
        vtok.append(torch.cat([t.tokens for t in toks]))
    ids, mask = tokenize(tok, split.texts, args.max_len)
    tfeat, ttok = dual.encode_text(ids, mask)
    dual.train(was)
    return {"vfeat": torch.stack(vfeat, 1), "vtok": torch.stack(vtok, 1), "tfeat": tfeat, "ttok": ttok.tokens,
            "ids": ids, "mask": mask}  # fmt: skip


def vtc_retrieval(dual: DualEncoder, tok: Any, split: Split, args: argparse.Namespace) -> dict[str, float]:
    enc = encode(dual, tok, split, args)
    m = retrieval.retrieval_metrics(enc["tfeat"] @ enc["vfeat"][:, 0].t(), split.text_clip)
    return {"t2v_r1": m["t2v_r1"], "v2t_r1": m["v2t_r1"], "t2v_r5": m["t2v_r5"], "chance_r1": 100 / len(split.clips)}


# --------------------------------------------------------------------------- negatives


def forbidden(kind: str, clip: Tensor, content: Tensor) -> Tensor:
    """``(B, B)`` True where pair (query i, candidate j) may not be a negative: the diagonal, and with
    ``hard_masked`` also the same clip (another caption of it) and the same content (the caption fits)."""
    eye = torch.eye(len(clip), dtype=torch.bool)
    if kind not in ("hard_masked", "mixed"):
        return eye
    return eye | (clip[:, None] == clip[None, :]) | (content[:, None] == content[None, :])


def sample_negatives(
    kind: str, vfeat: Tensor, tfeat: Tensor, temp: float, clip: Tensor, content: Tensor, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """One negative text per video and one negative video per text, ``(B,)`` each (see the module docstring).

    ``hard`` is ``losses.sample_hard_negatives`` itself; ``hard_masked`` is its softmax with the
    :func:`forbidden` pairs at weight 0 (a row with nothing left falls back to the diagonal-only mask);
    ``mixed`` takes each row's negative from ``hard_masked`` or from the same mask made uniform, half and half.
    """
    sim = vfeat @ tfeat.t() / temp  # (B, B) video x text
    if kind == "mixed":
        hard = sample_negatives("hard_masked", vfeat, tfeat, temp, clip, content, gen)
        flat = sample_negatives("hard_masked", vfeat, tfeat, math.inf, clip, content, gen)
        coin = torch.rand(2, len(clip), generator=gen) < 0.5
        return torch.where(coin[0], hard[0], flat[0]), torch.where(coin[1], hard[1], flat[1])
    if kind == "hard":
        return losses.sample_hard_negatives(sim, sim.t(), generator=gen)
    if kind == "uniform":
        sim = torch.zeros_like(sim)
    block = forbidden(kind, clip, content)
    empty = block.all(dim=1, keepdim=True)
    block = torch.where(empty, torch.eye(len(clip), dtype=torch.bool), block)
    w_v2t = F.softmax(sim.masked_fill(block, float("-inf")), dim=1)
    w_t2v = F.softmax(sim.t().masked_fill(block, float("-inf")), dim=1)
    return torch.multinomial(w_v2t, 1, generator=gen).squeeze(1), torch.multinomial(w_t2v, 1, generator=gen).squeeze(1)


def negative_mix(
    kind: str, vfeat: Tensor, tfeat: Tensor, temp: float, train: Split, args: argparse.Namespace
) -> dict[str, float]:
    """Share of the negatives ``kind`` draws on 100 training batches that are: the same clip, the same content
    (another clip whose captions fit), the same scene (other content), another scene."""
    sampler, gen, counts = PairSampler(len(train.texts), args.batch, 99), torch.Generator().manual_seed(3), np.zeros(4)
    for _ in range(100):
        idx = sampler.next()
        clip = train.text_clip[idx]
        content = train.content[clip]
        neg_t, neg_v = sample_negatives(kind, vfeat[clip, 0], tfeat[idx], temp, clip, content, gen)
        for other in (neg_t, neg_v):
            a, b = clip, clip[other]
            same_clip, same_content = a == b, (train.content[a] == train.content[b]) & (a != b)
            same_scene = (train.scene[a] == train.scene[b]) & ~same_clip & ~same_content
            counts += [int(same_clip.sum()), int(same_content.sum()), int(same_scene.sum()), 0]
            counts[3] += int((train.scene[a] != train.scene[b]).sum())
    counts = 100 * counts / counts.sum()
    return dict(zip(("same_clip", "same_content", "same_scene", "other_scene"), counts.tolist(), strict=True))


# --------------------------------------------------------------------------- VTM stage


def build_vtm_model(spec: RunSpec, args: argparse.Namespace, tok: Any, vtc_state: dict[str, Tensor]) -> Alpro:
    terms = spec.terms.split("+") if spec.impl == "library" else ["vtm", *(["mlm"] if spec.mlm else [])]
    if spec.impl == "probe" and spec.vtc:
        terms.append("vtc")
    torch.manual_seed(spec.seed)
    model = Alpro(alpro_config(args, tok, terms))
    model.dual.load_state_dict(vtc_state)
    if spec.init == "text":  # stand-in for ALPRO's BERT layers 7-12: fusion layer i <- trained text layer i
        text_layers = model.dual.text.layers
        for i, layer in enumerate(model.fusion.layers):
            layer.load_state_dict(text_layers[i % len(text_layers)].state_dict())
    if spec.towers == "frozen" and spec.impl == "probe":
        model.dual.requires_grad_(False)
    return model


def mlm_term(model: Alpro, tok: Any, ids: Tensor, mask: Tensor, vtok: Tensor | None, gen: torch.Generator) -> Any:
    """(MLM loss, accuracy over masked positions) with ``vtok`` as the video (None = text alone)."""
    special = (ids[..., None] == torch.tensor(tok.all_special_ids)).any(-1) | ~mask.bool()
    masked, labels = losses.mask_tokens(
        ids, vocab_size=len(tok), mask_token_id=tok.mask_token_id, special_mask=special, generator=gen
    )
    text = model.dual.text(masked, mask)
    logits = model.mlm_head(model.fuse(text.tokens, mask, vtok).text)
    sel = labels != losses.IGNORE_INDEX
    return losses.mlm_loss(logits, labels), (logits.argmax(-1)[sel] == labels[sel]).float().mean()


def train_vtm(
    spec: RunSpec, model: Alpro, tok: Any, train: Split, args: argparse.Namespace, cache: dict[str, Tensor]
) -> dict[str, Any]:
    """Train one VTM run; returns its training curve summary."""
    opt, sched = optimiser(model, spec.lr, spec.steps)
    sampler, rng = PairSampler(len(train.texts), spec.batch, spec.seed + 11), np.random.default_rng(spec.seed + 5)
    gen = torch.Generator().manual_seed(spec.seed + 17)
    ids, mask = cache["ids"], cache["mask"]
    temp = float(model.dual.temperature().detach())
    curve: dict[str, list[float]] = {"vtm": [], "mlm": [], "vtc": []}
    model.train()
    if spec.towers == "frozen" and spec.impl == "probe":
        model.dual.eval()
    start = time.perf_counter()
    for _ in range(spec.steps):
        idx = sampler.next()
        clip = train.text_clip[idx]
        if spec.impl == "library":
            video = pick_frames(train.frames[clip], args.num_frames, "rand", rng)
            ctx = StepContext(vocab=TextVocab.of(tok), generator=gen)
            out = alpro_step(model, PretrainBatch(video, ids[idx], mask[idx]), ctx)
            loss = out["loss"]
            for key in curve:
                if f"loss_{key}" in out:
                    curve[key].append(float(out[f"loss_{key}"].detach()))
        else:
            if spec.towers == "frozen":
                draw = torch.from_numpy(rng.integers(TRAIN_DRAWS, size=len(idx)))
                vfeat, vtok = cache["vfeat"][clip, draw], cache["vtok"][clip, draw]
                tfeat, ttok = cache["tfeat"][idx], cache["ttok"][idx]
            else:
                video = pick_frames(train.frames[clip], args.num_frames, "rand", rng)
                vfeat, vout = model.dual.encode_video(video)
                tfeat, tout = model.dual.encode_text(ids[idx], mask[idx])
                vtok, ttok = vout.tokens, tout.tokens
            with torch.no_grad():
                neg_t, neg_v = sample_negatives(spec.neg, vfeat, tfeat, temp, clip, train.content[clip], gen)
            t_idx, v_idx = losses.vtm_pair_indices(neg_t, neg_v)
            loss = losses.vtm_loss(vtm_logits(model, ttok[t_idx], mask[idx][t_idx], vtok[v_idx]))
            curve["vtm"].append(float(loss))
            if spec.mlm:
                mlm, _ = mlm_term(model, tok, ids[idx], mask[idx], vtok, gen)
                loss = loss + mlm
                curve["mlm"].append(float(mlm))
            if spec.vtc and spec.towers == "train":
                vtc = losses.vtc_loss(vfeat, tfeat, model.dual.temperature())
                loss = loss + vtc
                curve["vtc"].append(float(vtc))
        loss.backward()
        clip_gradients([p for p in model.parameters() if p.requires_grad], 20.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
    model.eval()
    summary = {f"train_{k}_first100": float(np.mean(v[:100])) for k, v in curve.items() if v}
    summary |= {f"train_{k}_last100": float(np.mean(v[-100:])) for k, v in curve.items() if v}
    return summary | {"seconds": time.perf_counter() - start}


# --------------------------------------------------------------------------- held-out measurements


@torch.no_grad()
def heldout_losses(model: Alpro, enc: dict[str, Tensor], test: Split, args: argparse.Namespace) -> dict[str, float]:
    """Held-out VTM loss on 1:2 batches (3 passes over the test pairs) per negative sampler."""
    temp, out = float(model.dual.temperature().detach()), {}
    for kind in ("hard", "hard_masked", "uniform"):
        sampler, gen, vals = PairSampler(len(test.texts), args.batch, 123), torch.Generator().manual_seed(5), []
        for _ in range(3 * (len(test.texts) // args.batch)):
            idx = sampler.next()
            clip = test.text_clip[idx]
            neg_t, neg_v = sample_negatives(kind, enc["vfeat"][clip, 0], enc["tfeat"][idx], temp, clip,
                                            test.content[clip], gen)  # fmt: skip
            t_idx, v_idx = losses.vtm_pair_indices(neg_t, neg_v)
            logits = vtm_logits(model, enc["ttok"][idx][t_idx], enc["mask"][idx][t_idx], enc["vtok"][clip, 0][v_idx])
            vals.append(float(losses.vtm_loss(logits)))
        out[f"loss_{kind}"] = float(np.mean(vals))
    return out


def probe_pairs(test: Split, seed: int = 0) -> dict[str, tuple[Tensor, Tensor]]:
    """Per test caption: (caption, its clip), (caption, a clip of another scene), (caption, a same-scene clip
    with other content); captions whose scene has no such clip are left out of the same-scene set."""
    rng = np.random.default_rng(seed)
    t_all = torch.arange(len(test.texts))
    own = test.text_clip
    other, same_t, same_v = [], [], []
    for t, c in enumerate(own.tolist()):
        diff = torch.nonzero(test.scene != test.scene[c]).squeeze(1)
        other.append(int(diff[rng.integers(len(diff))]))
        same = torch.nonzero((test.scene == test.scene[c]) & (test.content != test.content[c])).squeeze(1)
        if len(same):
            same_t.append(t)
            same_v.append(int(same[rng.integers(len(same))]))
    return {"pos": (t_all, own), "other_scene": (t_all, torch.tensor(other)),
            "same_scene": (torch.tensor(same_t), torch.tensor(same_v))}  # fmt: skip


@torch.no_grad()
def pair_logits(model: Alpro, enc: dict[str, Tensor], t_idx: Tensor, v_idx: Tensor, batch: int = 256) -> Tensor:
    out = [
        vtm_logits(model, enc["ttok"][t_idx[i : i + batch]], enc["mask"][t_idx[i : i + batch]],
                   enc["vtok"][v_idx[i : i + batch], 0])
        for i in range(0, len(t_idx), batch)
    ]  # fmt: skip
    return torch.cat(out)


def pair_types(model: Alpro, enc: dict[str, Tensor], test: Split) -> dict[str, float]:
    """Mean p(match), accuracy at 0.5 per pair type; ranking accuracy pos > neg per negative type; 1:1 loss."""
    pairs, out = probe_pairs(test), {}
    logits = {k: pair_logits(model, enc, t, v) for k, (t, v) in pairs.items()}
    for kind, lg in logits.items():
        p = lg.softmax(-1)[:, 1]
        out[f"p_{kind}"] = float(p.mean())
        out[f"acc_{kind}"] = 100 * float((p > 0.5).float().mean() if kind == "pos" else (p <= 0.5).float().mean())
    score = {k: lg[:, 1] - lg[:, 0] for k, lg in logits.items()}
    out["rank_other_scene"] = 100 * float((score["pos"] > score["other_scene"]).float().mean())
    same_t = pairs["same_scene"][0]
    out["rank_same_scene"] = 100 * float((score["pos"][same_t] > score["same_scene"]).float().mean())
    ce = {k: F.cross_entropy(lg, torch.full((len(lg),), int(k == "pos")), reduction="mean") for k, lg in logits.items()}
    out["loss_balanced"] = float(0.5 * ce["pos"] + 0.25 * ce["other_scene"] + 0.25 * ce["same_scene"])
    return out


def reranked(model: Alpro, enc: dict[str, Tensor], test: Split, k: int) -> dict[str, float]:
    """t2v / v2t R@1 with the top-k of the VTC similarity re-scored by VTM (both score rules)."""
    sim = enc["tfeat"] @ enc["vfeat"][:, 0].t()  # (T, V) cosine, as evaluate_retrieval

    def scorer(t_idx: Tensor, v_idx: Tensor) -> Tensor:
        return pair_logits(model, enc, t_idx, v_idx)

    out = {}
    for rule in retrieval.RULES:
        scores, _ = retrieval.topk_rerank(sim, k, scorer, batch_size=256, rule=rule)
        m = retrieval.retrieval_metrics(scores, test.text_clip)
        out[f"{rule}_t2v_r1"], out[f"{rule}_v2t_r1"] = m["t2v_r1"], m["v2t_r1"]
    vtc = retrieval.retrieval_metrics(sim, test.text_clip)
    return out | {"vtc_t2v_r1": vtc["t2v_r1"], "vtc_v2t_r1": vtc["v2t_r1"]}


@torch.no_grad()
def cls_attention(model: Alpro, enc: dict[str, Tensor], test: Split) -> dict[str, float]:
    """Share of the fused text [CLS]'s attention (mean over heads and positive test pairs) on video tokens,
    in the first and the last fusion layer, and the video tokens' share of the unpadded sequence."""
    layers, seen = model.fusion.layers, {}

    def keep(i: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            seen[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    handles = [
        layer.attention.self.register_forward_pre_hook(keep(i), with_kwargs=True) for i, layer in enumerate(layers)
    ]
    try:
        t_idx, v_idx = probe_pairs(test)["pos"]
        model.fuse(enc["ttok"][t_idx], enc["mask"][t_idx], enc["vtok"][v_idx, 0])
    finally:
        for h in handles:
            h.remove()
    text_len, video_len = enc["mask"].shape[1], enc["vtok"].shape[2]
    mask = torch.cat([enc["mask"][t_idx].bool(), torch.ones(len(t_idx), video_len, dtype=torch.bool)], 1)
    out = {"video_token_share": 100 * float((video_len / mask.sum(1)).mean())}
    for name, i in (("first", 0), ("last", len(layers) - 1)):
        attn, h = layers[i].attention.self, seen[i]
        heads, d = attn.num_attention_heads, attn.attention_head_size
        q = attn.query(h[:, :1]).view(len(h), 1, heads, d).transpose(1, 2)  # (P, H, 1, d)
        k = attn.key(h).view(len(h), -1, heads, d).transpose(1, 2)  # (P, H, S, d)
        w = (q @ k.transpose(-1, -2) * attn.scaling).masked_fill(~mask[:, None, None], float("-inf")).softmax(-1)
        out[f"cls_to_video_{name}"] = 100 * float(w[..., text_len:].sum(-1).mean())
    return out


@torch.no_grad()
def mlm_probe(model: Alpro, tok: Any, enc: dict[str, Tensor], test: Split) -> dict[str, float]:
    """Held-out MLM loss / accuracy with the caption's clip, another scene's clip, and no video (same masks)."""
    t_idx, other = probe_pairs(test)["other_scene"]
    out = {}
    for name, vtok in (("own", enc["vtok"][test.text_clip, 0]), ("other", enc["vtok"][other, 0]), ("none", None)):
        gen = torch.Generator().manual_seed(21)
        loss, acc = mlm_term(model, tok, enc["ids"][t_idx], enc["mask"][t_idx], vtok, gen)
        out[f"mlm_loss_{name}"], out[f"mlm_acc_{name}"] = float(loss), 100 * float(acc)
    return out


def evaluate_run(model: Alpro, tok: Any, test: Split, args: argparse.Namespace) -> dict[str, float]:
    model.eval()
    enc = encode(model.dual, tok, test, args)
    out = heldout_losses(model, enc, test, args) | pair_types(model, enc, test) | reranked(model, enc, test, args.k)
    out |= {f"{k}_final": v for k, v in cls_attention(model, enc, test).items()}
    if model.mlm_head is not None:
        out |= mlm_probe(model, tok, enc, test)
    return out


# --------------------------------------------------------------------------- tables


def table(title: str, head: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


def f1(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def f3(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def print_tables(vtc: dict, mixes: dict, results: dict[str, dict], n_test: int, args: argparse.Namespace) -> None:
    chance = 100 / n_test
    table(
        f"VTC stage ({args.vtc_steps} updates, batch {args.batch}, lr {args.vtc_lr}); {n_test} test clips",
        ["model", "t2v R@1", "v2t R@1", "t2v R@5", "chance R@1", "chance R@5", "temp"],
        [["VTC-only dual encoder", f1(vtc["t2v_r1"]), f1(vtc["v2t_r1"]), f1(vtc["t2v_r5"]), f1(chance),
          f1(5 * chance), f3(vtc["temp"])]],
    )  # fmt: skip
    table(
        "What each negative sampler draws on training batches (% of negatives; VTC-trained similarity)",
        ["sampler", "same clip", "same content", "same scene", "other scene"],
        [[k, *(f1(v) for v in m.values())] for k, m in mixes.items()],
    )
    rows_a, rows_b, rows_c = [], [], []
    for name, r in results.items():
        s = r["spec"]
        library = s["impl"] == "library"
        uses_mlm = "mlm" in s["terms"].split("+") if library else s["mlm"]
        rows_a.append([name, s["impl"], s["terms"] if library else s["neg"], f"{s['lr']:g}", str(s["steps"]),
                       s["init"], "y" if uses_mlm else "n", f3(r.get("train_vtm_first100")),
                       f3(r.get("train_vtm_last100")), f3(r["loss_hard"]), f3(r["loss_hard_masked"]),
                       f3(r["loss_uniform"]), f3(r["loss_balanced"]), f"{r['seconds']:.0f}"])  # fmt: skip
        rows_b.append([name, f3(r["p_pos"]), f3(r["p_other_scene"]), f3(r["p_same_scene"]), f1(r["acc_pos"]),
                       f1(r["acc_other_scene"]), f1(r["acc_same_scene"]), f1(r["rank_other_scene"]),
                       f1(r["rank_same_scene"])])  # fmt: skip
        mlm = "–"
        if "mlm_loss_own" in r:
            mlm = " / ".join(f3(r[f"mlm_loss_{k}"]) for k in ("own", "other", "none"))
        attn = [f"{f1(r[f'cls_to_video_{k}_init'])} -> {f1(r[f'cls_to_video_{k}_final'])}" for k in ("first", "last")]
        rows_c.append([name, f1(r["vtc_t2v_r1"]), f1(r["match_t2v_r1"]), f1(r["match_plus_sim_t2v_r1"]),
                       f1(r["vtc_v2t_r1"]), f1(r["match_v2t_r1"]), f1(chance), *attn,
                       f1(r["video_token_share_final"]), mlm])  # fmt: skip
    table(
        f"VTM runs: losses (held-out: test split, model in eval mode). Prior: 1:2 = {PRIOR_1_2:.4f}, balanced 1:1 "
        f"chance = ln 2 = {LN2:.3f} ({PRIOR_ON_BALANCED:.3f} for a head that learnt only the 1:2 prior)",
        ["run", "impl", "negatives / terms", "lr", "steps", "fusion init", "MLM", "train VTM first 100",
         "train VTM last 100", "held-out 1:2 hard", "held-out 1:2 hard masked", "held-out 1:2 uniform",
         "held-out 1:1 probe", "s"],
        rows_a,
    )  # fmt: skip
    table(
        "VTM runs: held-out pair types (p = mean p(match); acc at p > 0.5, chance-free baselines: a prior head gets "
        "0 / 100 / 100; rank = P(score pos > score neg) for the same caption, chance 50)",
        ["run", "p pos", "p other scene", "p same scene", "acc pos", "acc other scene", "acc same scene",
         "rank vs other scene", "rank vs same scene"],
        rows_b,
    )  # fmt: skip
    table(
        f"VTM runs: re-ranked retrieval (top-{args.k} of VTC re-scored) and fused [CLS] attention on video (%)",
        ["run", "VTC t2v R@1", "match t2v R@1", "match+sim t2v R@1", "VTC v2t R@1", "match v2t R@1", "chance R@1",
         "CLS->video first layer init -> final", "CLS->video last layer init -> final", "video share of tokens",
         "MLM loss own / other / no video"],
        rows_c,
    )  # fmt: skip


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the world and the VTC model, run every VTM spec, print the tables."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = [parse_spec(s, args) for s in args.runs]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    cfg, dataset, frames = ensure_world(args)
    train, test = (load_split(cfg, dataset, frames, s, args.size) for s in ("train", "test"))
    print(f"world: {len(train.clips)} train clips / {len(train.texts)} captions, {len(test.clips)} test clips / "
          f"{len(test.texts)} captions; torch threads {torch.get_num_threads()}", flush=True)  # fmt: skip
    tok = ensure_tokenizer(args, train)
    vtc_state, vtc = ensure_vtc(args, tok, train, test)
    print(f"VTC stage: held-out t2v R@1 {vtc['t2v_r1']:.1f}, v2t R@1 {vtc['v2t_r1']:.1f} "
          f"(chance {100 / len(test.clips):.1f})", flush=True)  # fmt: skip
    dual_cfg = alpro_config(args, tok, ["vtc"])
    dual = DualEncoder(dual_cfg.video, dual_cfg.text, embed_dim=dual_cfg.embed_dim, init_temp=dual_cfg.init_temp)
    dual.load_state_dict(vtc_state)
    cache = encode(dual, tok, train, args, draws=TRAIN_DRAWS)
    temp = float(dual.temperature().detach())
    mixes = {k: negative_mix(k, cache["vfeat"], cache["tfeat"], temp, train, args) for k in NEGATIVES}  # fmt: skip
    results: dict[str, dict] = {}
    for spec in specs:
        model = build_vtm_model(spec, args, tok, vtc_state)
        enc = encode(model.dual, tok, test, args)
        init = {f"{k}_init": v for k, v in cls_attention(model, enc, test).items()}
        print(f"run {spec.name}: {spec}", flush=True)
        summary = train_vtm(spec, model, tok, train, args, cache)
        results[spec.name] = {
            "spec": dataclasses.asdict(spec),
            **summary,
            **init,
            **evaluate_run(model, tok, test, args),
        }
        r = results[spec.name]
        print(f"  {summary['seconds']:.0f} s: train VTM {r.get('train_vtm_first100', float('nan')):.3f} -> "
              f"{r.get('train_vtm_last100', float('nan')):.3f}; held-out 1:2 hard {r['loss_hard']:.3f} "
              f"(prior {PRIOR_1_2:.4f}), masked {r['loss_hard_masked']:.3f}, uniform {r['loss_uniform']:.3f}; "
              f"rank vs other/same scene {r['rank_other_scene']:.1f}/{r['rank_same_scene']:.1f}; t2v R@1 VTC "
              f"{r['vtc_t2v_r1']:.1f} match {r['match_t2v_r1']:.1f} match+sim {r['match_plus_sim_t2v_r1']:.1f}",
              flush=True)  # fmt: skip
    print_tables(vtc, mixes, results, len(test.clips), args)
    if args.json:
        doc = {"args": vars(args), "vtc": vtc, "negative_mix": mixes, "runs": results}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
