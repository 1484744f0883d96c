"""Reference step time: one training step of LAVIS's own ALPRO and ALBEF models, to compare with vlp's.

Runs ONLY under the scratch venv that holds PyPI ``salesforce-lavis`` 1.0.2 (``scripts/reference-venv.sh`` builds
it beside the checkout), never under the project's .venv, and never imports the ``vlp`` package (``--freed-memory
keep`` loads the one stdlib-only file ``src/vlp/host_memory.py`` by its path). From the repo root:

    scripts/reference-venv.sh                     # once: ../scratch/lavis-venv
    ../scratch/lavis-venv/bin/python benchmarks/speed/reference_step.py --model alpro_retrieval --threads 2
    ../scratch/lavis-venv/bin/python benchmarks/speed/reference_step.py --model albef_pretrain --threads 2 \\
        --precision bf16

What it times, per step: ``zero_grad``, the model's own ``forward(samples)`` (which tokenizes the captions and
computes the losses) and ``loss``, ``loss.backward()``, and one step of torch's default ``AdamW`` (lr 1e-4) over the
trainable parameters. ``--precision bf16`` runs forward + loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``.
The random inputs are made once, before the timer. ``--freed-memory keep`` has glibc keep the memory the process
frees, as vlp's training loop does (``vlp.host_memory``); the default, ``release``, is glibc's own behaviour, LAVIS's.

- ``--model alpro_retrieval``: ``lavis.models.alpro_models.alpro_retrieval.AlproRetrieval`` built by its own
  ``from_config`` from LAVIS's ``configs/models/alpro_retrieval_msrvtt.yaml`` (TimeSformer-B/16 at 224 px, divided
  space-time attention, drop-path 0.1; BERT-base from ``bert_config_alpro.json``: 6 text layers + 6 fusion layers),
  with ``n_frms = --frames`` and ``max_txt_len = --text-len``. Loss: in-batch VTC + VTM with hard negatives.
- ``--model albef_pretrain``: ``lavis.models.albef_models.albef_pretrain.AlbefPretrain`` built by its own
  ``from_config`` from ``configs/models/albef_pretrain_base.yaml`` (ViT-B/16 at 224 px; ``BertForMaskedLM`` from
  ``med_config_albef.json``, 30,522 word rows, 6 text + 6 cross-attention fusion layers), with
  ``queue_size = --queue`` and ``max_txt_len = --text-len``. Loss: ITC with queues + ITM + MLM, momentum
  distillation on (``epoch`` is set so the ramp-up has ended: alpha = 0.4).

How it avoids downloads (the model's layers, sizes and losses stay LAVIS's own code):

- LAVIS's package ``__init__`` files import every dataset, processor and task (decord, cv2, spacy, ...). The script
  puts empty package shells for ``lavis`` and ``lavis.models`` in ``sys.modules`` and registers what those files
  would (``library_root``, ``lavis.models.BaseModel``), then imports only the two model modules.
- ``init_tokenizer`` (``BertTokenizer.from_pretrained("bert-base-uncased")``) is patched to return a
  ``BertTokenizer`` over a vocab of a few hundred WordPiece tokens written to a temp dir at run time. Captions are
  ``--text-len - 2`` of its words, so each one is exactly ``--text-len`` tokens with [CLS] and [SEP].
- BERT configs are LAVIS's own JSON files shipped in the package, read by its ``from_config``.
- ALPRO: ``load_checkpoint_from_config`` (downloads the MSR-VTT checkpoint) is patched to do nothing: random init.
- ALBEF: ``VisionTransformerEncoder.from_config`` is called with ``from_pretrained=False`` (no DeiT download) and
  ``BertForMaskedLM.from_pretrained("bert-base-uncased", config=...)`` builds ``BertForMaskedLM(config)``.
- The models call ``torch.distributed`` (``all_gather_with_grad`` needs a process group even for one process), so a
  one-process gloo group is started over a file store on loopback, as a one-GPU LAVIS run would have.
- NumPy 2 dropped ``np.Inf``, which LAVIS's hard-negative sampling uses; it is aliased to ``np.inf``.

``--eval-videos N`` times LAVIS's ALPRO retrieval evaluation instead of a training step: ``compute_sim_matrix``
(``AlproRetrieval``'s own, under ``torch.no_grad`` in eval mode, as its retrieval task calls it) over ``N`` random
clips with one caption each, once per ``k_test`` of ``--ks``, after one untimed call. It encodes every text and clip,
then for each clip fuses its ``k_test`` best captions and for each caption its ``k_test`` best clips (each
direction's pairs fused apart, so a pair both directions pick is fused twice). The seconds spent in the text and
video encoders' forwards are timed by wrapping them, so the JSON gives encode and re-rank seconds apart, per k.

Output: one JSON line on stdout (model, precision, batch, step_s_median, step_s_all, peak_rss_mib (after the timed
steps), with ``--flops`` step_gflop, with ``--profile`` the top ops (op, ms, share, calls), params = the
trainable parameter count, torch and lavis versions); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist

MODELS = ("alpro_retrieval", "albef_pretrain")
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
IMAGE_SIZE = 224
LR = 1e-4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--batch", type=int, default=2, help="clips (ALPRO) or images (ALBEF) per step")
    parser.add_argument("--frames", type=int, default=4, help="frames per clip (ALPRO's TimeSformer)")
    parser.add_argument("--text-len", type=int, default=30, help="caption tokens, [CLS] and [SEP] included")
    parser.add_argument("--queue", type=int, default=65536, help="ALBEF's ITC queue size")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--freed-memory", choices=["release", "keep"], default="release",
                        help="what glibc does with freed memory: release = its defaults (LAVIS's), keep = vlp's "
                        "training default (vlp.host_memory)")  # fmt: skip
    parser.add_argument("--flops", action="store_true", help="also count one step's FLOPs (after the timed steps)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile one step (after the timed steps): its N costliest ops by own CPU time",
    )
    parser.add_argument("--eval-videos", type=int, default=0, help="ALPRO: time the retrieval evaluation of N clips")
    parser.add_argument("--ks", type=int, nargs="+", default=[16, 4], help="--eval-videos: k_test values")
    parser.add_argument("--eval-batch", type=int, default=32, help="--eval-videos: clips per video-encoder batch")
    args = parser.parse_args(argv)
    if args.text_len < 3:
        parser.error("--text-len must be at least 3 ([CLS], one word, [SEP])")
    if args.eval_videos and args.model != "alpro_retrieval":
        parser.error("--eval-videos times ALPRO's retrieval evaluation: use --model alpro_retrieval")
    if args.model == "albef_pretrain" and args.queue % args.batch:
        parser.error("ALBEF's queue size must be a multiple of --batch (LAVIS asserts it)")
    return args


def host_memory() -> types.ModuleType:
    """vlp's ``host_memory`` module, loaded alone from its file (it imports the standard library only)."""
    path = Path(__file__).resolve().parents[2] / "src" / "vlp" / "host_memory.py"
    spec = importlib.util.spec_from_file_location("vlp_host_memory", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_lavis() -> types.SimpleNamespace:
    """Import LAVIS's two model modules without running its package ``__init__`` files (see the module docstring)."""
    spec = importlib.util.find_spec("lavis")
    if spec is None or spec.origin is None:
        raise SystemExit("salesforce-lavis is not installed here: run this with scripts/reference-venv.sh's venv")
    root = Path(spec.origin).parent
    for name, path in (("lavis", root), ("lavis.models", root / "models")):
        shell = types.ModuleType(name)
        shell.__path__ = [str(path)]
        shell.__file__ = str(path / "__init__.py")
        sys.modules[name] = shell
    if not hasattr(np, "Inf"):
        np.Inf = np.inf  # type: ignore[attr-defined]  # removed in NumPy 2; LAVIS fills diagonals with -np.Inf

    from lavis.common.registry import registry
    from lavis.models.base_model import BaseModel

    registry.register_path("library_root", str(root))  # what lavis/__init__.py registers; get_abs_path reads it
    sys.modules["lavis.models"].BaseModel = BaseModel  # type: ignore[attr-defined]  # registry.register_model reads it

    from lavis.common.utils import get_abs_path
    from lavis.models.albef_models import AlbefBase
    from lavis.models.albef_models.albef_pretrain import AlbefPretrain
    from lavis.models.alpro_models import AlproBase
    from lavis.models.alpro_models.alpro_retrieval import AlproRetrieval
    from lavis.models.med import BertForMaskedLM
    from lavis.models.vit import VisionTransformerEncoder

    return types.SimpleNamespace(
        get_abs_path=get_abs_path,
        AlbefBase=AlbefBase,
        AlbefPretrain=AlbefPretrain,
        AlproBase=AlproBase,
        AlproRetrieval=AlproRetrieval,
        BertForMaskedLM=BertForMaskedLM,
        VisionTransformerEncoder=VisionTransformerEncoder,
    )


def write_vocab(folder: Path) -> tuple[Path, list[str]]:
    """A WordPiece vocab of 300 three-letter words plus BERT's special tokens; returns its file and the words."""
    words = ["".join(letters) for letters in itertools.product("bdfgklmnprst", "aeiou", "lnrst")]
    path = folder / "vocab.txt"
    path.write_text("\n".join(SPECIAL_TOKENS + words) + "\n", encoding="utf-8")
    return path, words


def captions(words: list[str], batch: int, text_len: int, rng: random.Random) -> list[str]:
    """``batch`` captions of ``text_len - 2`` vocab words: ``text_len`` tokens each with [CLS] and [SEP]."""
    return [" ".join(rng.choice(words) for _ in range(text_len - 2)) for _ in range(batch)]


def start_process_group(folder: Path) -> None:
    """A one-process gloo group over a file store (no TCP store; gloo's own device on loopback)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend="gloo", init_method=f"file://{folder / 'pg-store'}", rank=0, world_size=1)


def model_config(lavis: types.SimpleNamespace, cls: Any, model_type: str, **overrides: Any) -> Any:
    """The ``model`` node of LAVIS's own YAML for ``cls``/``model_type``, with ``overrides`` set."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(lavis.get_abs_path(cls.PRETRAINED_MODEL_CONFIG_DICT[model_type])).model
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def build_alpro(lavis: types.SimpleNamespace, tokenizer: Any, args: argparse.Namespace) -> torch.nn.Module:
    cfg = model_config(
        lavis, lavis.AlproRetrieval, "msrvtt", **{"timesformer.n_frms": args.frames, "max_txt_len": args.text_len}
    )
    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(lavis.AlproBase, "init_tokenizer", classmethod(lambda cls: tokenizer)))
        patches.enter_context(
            mock.patch.object(lavis.AlproRetrieval, "load_checkpoint_from_config", lambda self, cfg, **kw: None)
        )
        return lavis.AlproRetrieval.from_config(cfg)


def build_albef(lavis: types.SimpleNamespace, tokenizer: Any, args: argparse.Namespace) -> torch.nn.Module:
    cfg = model_config(lavis, lavis.AlbefPretrain, "base", queue_size=args.queue, max_txt_len=args.text_len)
    vit_from_config = lavis.VisionTransformerEncoder.from_config.__func__

    def vit_without_download(cls: Any, cfg: Any, from_pretrained: bool = False) -> Any:
        return vit_from_config(cls, cfg, from_pretrained=False)

    def bert_random_init(cls: Any, name: str, config: Any, **kwargs: Any) -> Any:
        return cls(config)

    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(lavis.AlbefBase, "init_tokenizer", classmethod(lambda cls: tokenizer)))
        patches.enter_context(
            mock.patch.object(lavis.VisionTransformerEncoder, "from_config", classmethod(vit_without_download))
        )
        patches.enter_context(
            mock.patch.object(lavis.BertForMaskedLM, "from_pretrained", classmethod(bert_random_init))
        )
        return lavis.AlbefPretrain.from_config(cfg)


def make_samples(args: argparse.Namespace, words: list[str]) -> dict[str, Any]:
    rng = random.Random(args.seed)
    text = captions(words, args.batch, args.text_len, rng)
    if args.model == "alpro_retrieval":
        # LAVIS's ALPRO video processors give (C, T, H, W) clips; TimeSformer's patch embedding reads (B, C, T, H, W).
        return {"video": torch.randn(args.batch, 3, args.frames, IMAGE_SIZE, IMAGE_SIZE), "text_input": text}
    # alpha = 0.4 * min(1, (epoch * iters_per_epoch + iters) / (2 * iters_per_epoch)): epoch 2 ends the ramp-up.
    return {
        "image": torch.randn(args.batch, 3, IMAGE_SIZE, IMAGE_SIZE),
        "text_input": text,
        "epoch": 2,
        "iters": 0,
        "num_iters_per_epoch": 1,
    }


def time_eval(model: torch.nn.Module, args: argparse.Namespace, words: list[str], log: Callable[[str], None]) -> dict:
    """``compute_sim_matrix`` over ``args.eval_videos`` random clips per ``k_test``: encode and re-rank seconds."""
    rng = random.Random(args.seed)
    n = args.eval_videos
    text = captions(words, n, args.text_len, rng)
    video = torch.randn(n, 3, args.frames, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(args.seed))
    batches = [{"video": video[i : i + args.eval_batch]} for i in range(0, n, args.eval_batch)]

    class Loader:  # what compute_sim_matrix reads of a data loader: the dataset's texts and images, and batches
        dataset = types.SimpleNamespace(text=text, image=list(range(n)))

        def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
            return iter(batches)

    encoding = [0.0]

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                encoding[0] += time.perf_counter() - start

        return wrapper

    model.eval()
    visual: Any = model.visual_encoder
    text_encoder: Any = model.text_encoder
    result: dict[str, Any] = {}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    with (
        mock.patch.object(visual, "forward_features", timed(visual.forward_features)),
        mock.patch.object(text_encoder, "forward_text", timed(text_encoder.forward_text)),
        torch.no_grad(),
        autocast,
    ):
        for k in [args.ks[0], *args.ks]:  # the first call is the warm-up
            encoding[0] = 0.0
            start = time.perf_counter()
            scores = model.compute_sim_matrix(Loader(), {"k_test": k})
            total = time.perf_counter() - start
            result[str(k)] = {"total_s": total, "encode_s": encoding[0], "rerank_s": total - encoding[0],
                              "fused_pairs": 2 * n * k}  # fmt: skip
            finite = bool(np.isfinite(scores[0]).all() and np.isfinite(scores[1]).all())
            log(f"k_test {k}: {total:.2f} s ({encoding[0]:.2f} s encoding); scores finite: {finite}")
    return result


def time_steps(
    model: torch.nn.Module, samples: dict[str, Any], args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[list[float], dict[str, Any]]:
    """Run ``args.warmup`` + ``args.steps`` training steps; return the timed steps' wall seconds, and with
    ``--flops`` / ``--profile`` what one more step counted: its FLOPs (forward and backward, as vlp's
    ``bench_mfu.py`` counts them: ``torch.utils.flop_counter``, in the run's precision) and its costliest ops."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    model.train()

    def step() -> torch.Tensor:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16" else contextlib.nullcontext()
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(samples).loss
        loss.backward()
        optimizer.step()
        return loss

    times: list[float] = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss = step()
        seconds = time.perf_counter() - start
        timed = i >= args.warmup
        if timed:
            times.append(seconds)
        log(f"step {i} ({'timed' if timed else 'warmup'}): {seconds:.3f} s, loss {loss.item():.4f}")
    # the memory high-water mark of the timed steps, before a counting or profiling step can raise it
    counted: dict[str, Any] = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if args.flops:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            step()
        counted["step_gflop"] = counter.get_total_flops() / 1e9
        log(f"one step: {counted['step_gflop']:.2f} GFLOP")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
        total = sum(e.self_cpu_time_total for e in events)
        events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        counted["profile"] = [{"op": e.key, "ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total,
                               "calls": e.count} for e in events[: args.profile]]  # fmt: skip
    return times, counted


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Keep stdout for the one JSON line: anything LAVIS or transformers prints goes to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def run(args: argparse.Namespace) -> dict[str, Any]:
    def log(message: str) -> None:
        print(f"[reference_step] {message}", file=sys.stderr, flush=True)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.freed_memory == "keep":
        log(f"freed memory kept: {host_memory().keep_freed_memory()}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    lavis = import_lavis()
    from transformers import BertTokenizer

    with tempfile.TemporaryDirectory(prefix="reference-step-") as tmp:
        folder = Path(tmp)
        vocab, words = write_vocab(folder)
        tokenizer = BertTokenizer(vocab_file=str(vocab), do_lower_case=True)
        start_process_group(folder)
        try:
            build = build_alpro if args.model == "alpro_retrieval" else build_albef
            start = time.perf_counter()
            model = build(lavis, tokenizer, args)
            log(f"built {type(model).__name__} in {time.perf_counter() - start:.1f} s")
            samples = make_samples(args, words)
            ids = tokenizer(samples["text_input"], padding="longest", return_tensors="pt").input_ids
            text_encoder: Any = model.text_encoder
            log(f"caption tokens: {tuple(ids.shape)}; text encoder word rows: {text_encoder.config.vocab_size}")
            params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            log(f"trainable parameters: {params:,}; torch threads: {torch.get_num_threads()}")
            times, evaluation, counted = [], {}, {}
            if args.eval_videos:
                evaluation = time_eval(model, args, words, log)
            else:
                times, counted = time_steps(model, samples, args, log)
        finally:
            dist.destroy_process_group()

    return {
        "model": args.model,
        "eval": evaluation,
        "precision": args.precision,
        "batch": args.batch,
        "step_s_median": statistics.median(times) if times else None,
        "step_s_all": times,
        "peak_rss_mib": counted.pop("peak_rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        **counted,
        "params": params,
        "torch": torch.__version__,
        "lavis": importlib.metadata.version("salesforce-lavis"),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    with stdout_to_stderr():
        result = run(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
