"""The one training loop every model of vlp uses: generic over a model, a step function and a data source.

``train(model, step_fn, data, cfg, optim_cfg)`` runs ``cfg.max_steps`` optimiser updates. Each update
draws ``cfg.grad_accum`` micro-batches from ``data``, calls ``step_fn(model, batch)`` (which returns a
mapping of named scalars that must include ``"loss"``), back-propagates ``loss / grad_accum``, clips
the global gradient norm, steps AdamW and the LR schedule (:mod:`vlp.train.optim`). It checkpoints
every ``cfg.ckpt_every`` updates and at the end (:mod:`vlp.train.checkpoint`) and, with
``resume=True``, continues bit-exactly from the newest intact checkpoint in ``<out_dir>/checkpoints``
(a damaged one is skipped with a warning): model, optimiser, schedule, every global RNG and the data
position. Checkpoints record the caller's ``identity`` (e.g. the tokenizer's digest) and the last
logged metrics; a resume against another identity is refused.

Nothing NaN or infinite is trained on or saved: the starting weights are checked, and after every update one
fused reduction over the parameters and the loss terms (``loss``, ``loss_*``) stops the run with
:class:`NonFiniteTrainingError` (the step, the terms or the parameters, where a rerun resumes) before the next
forward reads the weights and before a checkpoint could hold them. A checkpoint whose weights or optimiser state
hold a NaN or an infinity counts as damaged: a resume skips it with a warning that names it and takes the newest
finite one. ``<out_dir>`` may hold no symbolic link (``checkpoints/`` itself, a checkpoint's directory, any file):
the readers of a model directory refuse one, so the loop refuses one too, before the resume reads and before each
checkpoint is written (:func:`vlp.train.checkpoint.refuse_output_links`).

Contract for ``step_fn``
    * it must run the model through ``model(...)`` (the forward of the possibly DDP-wrapped module),
      or DDP does not synchronise gradients; use :func:`unwrap` for other methods;
    * only ``"loss"`` is differentiated; every entry (e.g. ``"loss_vtc"``, ``"temp"``) is logged as
      ``train/<name>``, averaged over the micro-batches and steps since the last log and over ranks;
    * ``loss`` should be a mean over the micro-batch: then ``k`` equal micro-batches accumulate to the
      gradient of one ``k`` times larger batch.

Contract for ``data``
    An iterable of batches; iterating it again starts the next epoch (the loop keeps one iterator per
    epoch). For exact resume it also has ``state_dict()`` / ``load_state_dict()`` whose state is the
    position of the batches *handed out*, not of what a prefetching loader's workers fetched ahead:
    :mod:`vlp.data.loader`'s ``SamplerBatches`` over a ``ResumableSampler`` or ``ShardOrderSampler`` does this,
    with or without worker processes (``num_workers``). If it has ``close()``, :func:`train` calls it when it
    ends, normally, interrupted or by an exception, so no worker process outlives the training.

Talking while it trains (rank 0, on stderr): a resume says ``resuming from step M (<checkpoint>)`` before the
first update; with ``cfg.progress`` a terminal gets a tqdm bar and anything else (a log file, a pipeline's
subprocess, CI) one plain line per logged interval (:func:`progress_line`); printing draws no random numbers, so
it never changes a run. An interruption (Ctrl-C, or a SIGTERM the CLI turns into one) during the updates is
re-raised as :class:`TrainingInterrupted`, which says the step reached and the newest checkpoint a rerun resumes
from; checkpoint files are written atomically with ``state.json`` last, so an interrupted save leaves no
checkpoint that counts.

Distributed: under ``torchrun`` (after :func:`vlp.distributed.init_from_env`) the model is wrapped
in DDP, non-final micro-steps run under ``no_sync()``, metrics are averaged over ranks and only rank 0
logs, shows progress and writes model/optimiser (every rank writes its own RNG file). The forward and the
loss run under bf16 autocast on CUDA when ``cfg.bf16`` is set, on the CPU when ``cfg.cpu_bf16`` is; the
backward and the optimiser keep fp32 weights and gradients. ``cfg.freed_memory="keep"`` (the default) has glibc keep
the memory the process frees for the next step's tensors (:mod:`vlp.host_memory`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import resource
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from vlp import distributed, storage
from vlp.data.loader import move_to_device
from vlp.host_memory import FREED_MEMORY, apply_freed_memory
from vlp.rng import seed_everything
from vlp.settings import LoopSettings
from vlp.train.checkpoint import (
    STATE_FILE,
    CheckpointError,
    DamagedCheckpointError,
    all_finite,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    nonfinite_names,
    read_state,
    refuse_output_links,
    save_checkpoint,
    save_rank_rng,
)
from vlp.train.optim import OptimConfig, build_optimizer, build_scheduler, clip_gradients

StepFn = Callable[[nn.Module, Any], Mapping[str, Tensor | float]]


# --------------------------------------------------------------------------- metrics


class MetricsLogger(Protocol):
    """Where training metrics go (a JSONL file now; MLflow implements the same two methods)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_params(self, params: dict[str, Any]) -> None: ...


class JsonlMetricsLogger:
    """One JSON object per line: ``{"step": s, "train/loss": ...}`` or ``{"params": {...}}``.

    Written through :class:`vlp.storage.AppendLog`: local files are appended to; on ``s3://`` (no appends) the
    whole file is rewritten atomically on every call, which is fine for the few thousand lines of a run.
    :func:`train` calls :meth:`rewind` before it logs, so the file holds each step once, also after a resume (read
    it with :func:`vlp.tracking.read_metrics`).
    """

    def __init__(self, uri: str) -> None:
        self.uri = str(uri)
        self._log = storage.AppendLog(self.uri)

    def _write(self, record: dict[str, Any]) -> None:
        self._log.append(json.dumps(record, sort_keys=True))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._write({"step": int(step), **{k: float(v) for k, v in metrics.items()}})

    def log_params(self, params: dict[str, Any]) -> None:
        self._write({"params": json.loads(json.dumps(params, default=str))})

    def rewind(self, step: int) -> None:
        """Drop the lines of the steps after ``step``: a resume from checkpoint ``step`` logs them again.

        ``step == 0`` (training from the start) empties the file, params included. A line cut short by a
        kill is dropped too (it was being written after the last checkpoint).
        """
        if not storage.exists(self.uri):
            self._log = storage.AppendLog(self.uri)  # nothing held
            return
        kept = []
        for line in storage.read_text(self.uri).splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if (
                    step > 0
                    and isinstance(record, dict)
                    and ("params" in record or int(record.get("step", step + 1)) <= step)
                ):
                    kept.append(line)
        self._log.replace(kept)  # atomic on every backend


# --------------------------------------------------------------------------- config and result


@dataclass
class TrainConfig(LoopSettings):
    """How long to train, how often to log and checkpoint (:class:`vlp.settings.LoopSettings`, a config
    section's part), where to write and what the run is called."""

    out_dir: str = ""  # local path or s3:// URI; checkpoints go to <out_dir>/checkpoints
    max_steps: int = 1000  # optimiser updates of the whole run (the LR schedule spans them)
    ckpt_every: int = 0  # updates between checkpoints; 0: only at the end
    name: str = "train"  # what the progress display calls the run (e.g. the step: "pretrain")

    @classmethod
    def of(cls, section: LoopSettings, out_dir: str, name: str = "train") -> TrainConfig:
        """The loop settings of a config section (any :class:`LoopSettings`, e.g. ``cfg.pretrain``) as they are."""
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(LoopSettings)}, out_dir=out_dir,
                   name=name)  # fmt: skip

    def __post_init__(self) -> None:
        if not self.out_dir:
            raise ValueError("TrainConfig.out_dir is required (a local directory or an s3:// URI)")
        for name in ("max_steps", "grad_accum", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.ckpt_every < 0:
            raise ValueError(f"TrainConfig.ckpt_every must be >= 0 (0 = only at the end), got {self.ckpt_every}")
        if self.freed_memory not in FREED_MEMORY:
            raise ValueError(f"TrainConfig.freed_memory must be one of {list(FREED_MEMORY)}, got {self.freed_memory!r}")


class TrainingInterrupted(KeyboardInterrupt):
    """:func:`train` was interrupted (Ctrl-C, or a signal turned into a ``KeyboardInterrupt``) during its updates.

    ``step`` is the optimiser updates done when it stopped; ``resume_step`` the step of the newest complete
    checkpoint under ``<out_dir>/checkpoints`` (0 when there is none), where a rerun resumes; ``signum`` the
    signal's number (the interrupting exception's ``signum`` attribute, else ``SIGINT``'s).
    """

    def __init__(self, step: int, resume_step: int, checkpoint: str | None, signum: int) -> None:
        super().__init__(f"interrupted at step {step}; a rerun resumes from step {resume_step}")
        self.step, self.resume_step, self.checkpoint, self.signum = step, resume_step, checkpoint, signum


class NonFiniteTrainingError(ValueError):
    """A loss term or the weights became NaN or infinite: :func:`train` stopped before anything read them (the next
    forward, a checkpoint). The message names the step, the term or the parameters, and where a rerun resumes."""


@dataclass
class TrainResult:
    """What a call of :func:`train` did."""

    step: int  # optimiser updates done in total (== max_steps unless interrupted)
    start_step: int  # where this call started (> 0 after a resume)
    resumed_from: str | None  # checkpoint URI resumed from
    checkpoint: str | None  # last checkpoint written
    last_metrics: dict[str, float] = field(default_factory=dict)
    tracking: dict[str, Any] = field(default_factory=dict)  # set by callers that track: what reached MLflow


# --------------------------------------------------------------------------- helpers


def batch_size_of(batch: Any) -> int:
    """Leading dimension of the first tensor found in ``batch`` (0 when there is none): the clip count."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    values: Any = ()
    if isinstance(batch, Mapping):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        values = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    for value in values:
        n = batch_size_of(value)
        if n:
            return n
    return 0


def _memory_metrics(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {"train/peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    return {"train/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB


def enable_grad_checkpointing(model: nn.Module, enable: bool = True) -> int:
    """Recompute activations in the backward pass wherever ``model`` has a part that can: a transformers
    ``PreTrainedModel`` (``activation_checkpointing_enable``, non-reentrant), a timm-style ``set_grad_checkpointing``,
    or a tower with a ``grad_checkpointing`` switch (vlp's text, fusion and cross-attention stacks, CLIP's towers).
    The results and gradients do not change (the recomputation replays the RNG state); the memory of the activations
    does. ``enable=False`` turns it off again in the same parts.

    Returns:
        How many parts were switched; with none, a warning says training goes on without.
    """
    switched, inside = 0, set()
    for module in model.modules():
        if id(module) in inside:  # below a part already switched: it checkpoints its own layers
            continue
        hf_on = getattr(module, "activation_checkpointing_enable", None)
        hf_off = getattr(module, "activation_checkpointing_disable", None)
        timm = getattr(module, "set_grad_checkpointing", None)
        if callable(hf_on) and callable(hf_off):
            if enable:
                hf_on(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                hf_off()
        elif callable(timm):
            timm(enable)
        elif isinstance(getattr(module, "grad_checkpointing", None), bool):
            setattr(module, "grad_checkpointing", enable)  # noqa: B010 (an attribute mypy sees as a submodule)
        else:
            continue
        switched += 1
        inside |= {id(m) for m in module.modules()}
    if not switched and enable:
        warnings.warn(f"grad_checkpointing requested but no part of {type(model).__name__} can recompute its "
                      "activations; training without it", stacklevel=3)  # fmt: skip
    return switched


# a transformer block of any family: TimeSformer's and ViT's ``blocks.<i>``, the text / fusion / cross-attention
# stacks' and CLIP's ``layers.<i>``
BLOCK_NAME = re.compile(r"(^|\.)(blocks|layers)\.\d+$")


def compile_unavailable(device: torch.device) -> str:
    """Why ``torch.compile`` cannot run on ``device`` here ("" when it can): a small function is compiled and run,
    which needs the whole tool chain (Dynamo, Inductor, on the CPU a C++ compiler)."""
    try:
        probe = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2.0 + 1.0, dynamic=False)
        probe(torch.ones(8, device=device))
    except Exception as exc:
        cause = getattr(exc, "inner_exception", None) or exc  # Dynamo wraps the backend's error
        lines = [line for line in str(cause).splitlines() if line.strip()]
        said = lines[0].strip() if lines else ""
        name = type(cause).__name__
        return said if said.startswith(name) else f"{name}: {said}"
    return ""


COMPILE_RECOMPILE_LIMIT = 32  # compiled variants per block (grad mode x train/eval x batch sizes x precision)


def compile_blocks(model: nn.Module, what: str = "training") -> int:
    """Compile every transformer block of ``model`` in place with ``torch.compile`` (``nn.Module.compile``: the
    parameters, their names and the state dict stay as they are, so checkpoints and model directories do not
    change). One block at a time, not the whole step: the blocks of a stack share one compiled graph, so compiling
    costs a few graphs, and the losses, gathers and random draws between blocks run as they are. Dropout inside a
    block draws from torch's generator as the eager block does (Inductor's ``fallback_random``), so a seed gives
    the same masks and a resume stays exact. A batch of another size (an epoch's last) compiles once more, with
    the batch dimension dynamic. Each block may compile up to :data:`COMPILE_RECOMPILE_LIMIT` variants (torch's
    default, 8, is reached by a block that runs with and without gradients, in train and eval mode, at several
    batch sizes and in both precisions; past the limit Dynamo logs a warning and runs those calls eagerly).

    Where ``torch.compile`` cannot run (:func:`compile_unavailable`), a warning names why and ``model`` runs
    eagerly.

    Returns:
        How many blocks were compiled.
    """
    device = next(model.parameters()).device
    why = compile_unavailable(device)
    if why:
        warnings.warn(f"compile requested but torch.compile does not work here ({why}); {what} runs eagerly",
                      stacklevel=2)  # fmt: skip
        return 0
    import torch._inductor.config as inductor

    inductor.fallback_random = True
    compiled: list[str] = []
    for name, module in model.named_modules():
        if BLOCK_NAME.search(name) and not any(name.startswith(done + ".") for done in compiled):
            module.compile(recompile_limit=COMPILE_RECOMPILE_LIMIT)
            compiled.append(name)
    if not compiled:
        warnings.warn(f"compile requested but {type(model).__name__} has no transformer block to compile; {what} "
                      "runs eagerly", stacklevel=2)  # fmt: skip
    return len(compiled)


# --------------------------------------------------------------------------- the loop


class _Run:
    """State of one :func:`train` call; each method is one phase of an update."""

    def __init__(self, model: nn.Module, step_fn: StepFn, data: Any, cfg: TrainConfig, optim_cfg: OptimConfig) -> None:
        self.model, self.step_fn, self.data, self.cfg, self.optim_cfg = model, step_fn, data, cfg, optim_cfg
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.device = next(model.parameters()).device
        self.autocast = {"cpu": cfg.cpu_bf16, "cuda": cfg.bf16}.get(self.device.type, False)
        if self.autocast and self.device.type == "cpu":
            instead = "cpu_bf16=false in the step's section (pretrain, retrieval, qa)"
            distributed.require_cpu_bf16("cpu_bf16=true", instead)
        self.optimizer = build_optimizer(model, optim_cfg)
        self.scheduler = build_scheduler(self.optimizer, optim_cfg, cfg.max_steps)
        # what an update changes; the rest (frozen, or moved in the forward as a momentum encoder's running mean of
        # these) cannot turn NaN or infinite while these stay finite
        self.trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.ckpt_root = storage.join(cfg.out_dir, "checkpoints")
        self.step, self.last_lr = 0, float("nan")
        self.iterator: Iterator[Any] | None = None
        self.identity: dict[str, str] = {}
        self.last_metrics: dict[str, float] = {}  # the newest logged metrics (restored on resume)
        self.sums: dict[str, Tensor] = {}
        self.window_micro, self.window_clips, self.window_start = 0, 0, time.perf_counter()

    def resume(self) -> str | None:
        """Load the newest intact checkpoint (all ranks), if any; returns its URI.

        A damaged checkpoint (a truncated or unreadable file, or NaN or infinite weights or optimiser state: no run
        continues from those) is skipped with a warning that names the file, and the previous one is tried; nothing
        is restored from a damaged one. Call it after :func:`refuse_output_links`: the listing does not follow links.

        Raises:
            CheckpointError: the checkpoint records another ``identity`` value (e.g. another tokenizer), or
                every checkpoint under ``<out_dir>/checkpoints`` is damaged.
        """
        found = [uri for _, uri in reversed(list_checkpoints(self.ckpt_root))]
        damaged: list[str] = []
        for uri in found:
            try:
                self._check_identity(uri, self.identity)
                loaded = load_checkpoint(uri, self.model, self.optimizer, self.scheduler, rank=self.rank)
            except DamagedCheckpointError as exc:
                damaged.append(str(exc))
                continue
            if damaged:
                bad = "; ".join(damaged)
                warnings.warn(f"skipped the damaged checkpoint: {bad}; resumed from {uri}", stacklevel=3)
            self._restore_position(uri, loaded)
            return uri
        if damaged:
            raise DamagedCheckpointError(
                f"every checkpoint under {self.ckpt_root} is damaged ({'; '.join(damaged)}); delete them to "
                "train from the start"
            )
        return None

    @staticmethod
    def _check_identity(uri: str, identity: Mapping[str, str]) -> None:
        recorded = read_state(uri)["extra"].get("identity", {})
        for key, value in identity.items():
            if key in recorded and recorded[key] != value:
                raise CheckpointError(
                    f"{storage.join(uri, STATE_FILE)} was trained with {key}={recorded[key]} but this run has "
                    f"{key}={value}; resuming would feed it other inputs. Restore what it was trained with, or "
                    "train into a new output directory"
                )

    def _restore_position(self, uri: str, loaded: Any) -> None:
        self.last_metrics = dict(loaded.extra.get("last_metrics", {}))
        if loaded.data_state is not None:
            if not hasattr(self.data, "load_state_dict"):
                raise ValueError(f"{uri} records a data position but the data source has no load_state_dict()")
            self.data.load_state_dict(loaded.data_state)
        elif hasattr(self.data, "load_state_dict"):
            warnings.warn(f"{uri} has no data position; the data restarts from its current state", stacklevel=4)
        self.step = loaded.step

    def next_batch(self) -> Any:
        """Next batch; a finished pass over ``data`` starts the next epoch."""
        for _ in range(2):
            if self.iterator is None:
                self.iterator = iter(self.data)
            try:
                return next(self.iterator)
            except StopIteration:
                self.iterator = None
        raise ValueError("the data source yielded no batch for a whole epoch (empty dataset, or batch > dataset?)")

    def update(self, ddp_model: nn.Module) -> Tensor:
        """One optimiser update over ``grad_accum`` micro-batches; returns the pre-clip gradient norm."""
        accum = self.cfg.grad_accum
        for micro in range(accum):
            batch = move_to_device(self.next_batch(), self.device)
            self.window_clips += batch_size_of(batch)
            # DDP all-reduces the gradients on the last micro-batch only
            ddp = ddp_model if isinstance(ddp_model, nn.parallel.DistributedDataParallel) else None
            sync = ddp.no_sync() if ddp is not None and micro < accum - 1 else contextlib.nullcontext()
            with sync:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                    outputs = self.step_fn(ddp_model, batch)
                if "loss" not in outputs:
                    raise KeyError(f"step_fn must return a 'loss' entry; it returned {sorted(outputs)}")
                loss = outputs["loss"]
                if not isinstance(loss, Tensor):
                    raise TypeError(f"step_fn's 'loss' must be a tensor (it is backpropagated), got {type(loss)}")
                (loss / accum).backward()
            for key, value in outputs.items():
                value = torch.as_tensor(value).detach().to(self.device, torch.float64)  # exact sums for logging
                self.sums[key] = self.sums.get(key, 0) + value
            self.window_micro += 1
        grad_norm = clip_gradients(self.model.parameters(), self.optim_cfg.grad_clip)
        self.last_lr = float(self.scheduler.get_last_lr()[0])  # the lr this update uses
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.check_finite()
        return grad_norm

    def check_finite(self) -> None:
        """Stop when a loss term of this update, or a weight after it, is NaN or infinite: before the next forward
        (where e.g. hard-negative sampling would draw from NaN similarities) and before a checkpoint could hold it.
        One reduction over the trained parameters (:func:`all_finite`) and one over the window's loss sums (a NaN or
        an infinity stays in a sum), read with one synchronisation (and one all-reduce under DDP, so that every
        rank stops); only when they say something may be wrong are the tensors checked one by one.

        Raises:
            NonFiniteTrainingError: naming the step, the loss terms or the parameters, and where a rerun resumes.
        """
        terms = {k: v for k, v in self.sums.items() if k == "loss" or k.startswith("loss_")}
        ok = all_finite(self.trained).to(self.device)
        if terms:
            ok = ok & torch.stack(list(terms.values())).isfinite().all()
        if _everywhere(ok):
            return
        bad = [f"{k}={float(v):g}" for k, v in terms.items() if not math.isfinite(float(v))]
        what = f"the loss term{'s' if len(bad) > 1 else ''} {', '.join(bad)}" if bad else self.nonfinite_weights()
        if _everywhere(torch.tensor(not what, device=self.device)):  # every rank: finite weights, sums overflowed
            return
        before = [step for step, _ in _listed(self.ckpt_root) or [] if step < self.step]
        fix = "lower the learning rate or check the inputs"
        if before:  # a resume continues with the optimiser state and schedule saved there: the config's lr is not read
            fix = (f"a rerun resumes from step {before[-1]} with the weights and learning rate saved there: {fix}, "
                   "and train into a new --out (or delete its checkpoints)")  # fmt: skip
        raise NonFiniteTrainingError(
            f"{self.cfg.name} diverged at step {self.step} (lr {self.last_lr:g}): {what or 'on another rank'}; no "
            f"checkpoint holds this step; {fix}"
        )

    def nonfinite_weights(self) -> str:
        """Which parameters hold a NaN or an infinity, e.g. ``NaN or infinite weights in 2 of 9 parameters (a, b)``;
        "" when none does."""
        named = dict(self.model.named_parameters())
        wrong = nonfinite_names(named)
        if not wrong:
            return ""
        shown = ", ".join(wrong[:3]) + (", ..." if len(wrong) > 3 else "")
        return f"NaN or infinite weights in {len(wrong)} of {len(named)} parameters ({shown})"

    def metrics(self, grad_norm: Tensor) -> dict[str, float]:
        """Window averages (over micro-batches and ranks), lr, grad norm, clips/s, memory; resets the window."""
        means = {f"train/{k}": distributed.all_reduce_mean(v / self.window_micro).item() for k, v in self.sums.items()}
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        means |= {
            "train/lr": self.last_lr,
            "train/grad_norm": float(grad_norm),
            "train/clips_per_s": self.window_clips * self.world / elapsed,
        } | _memory_metrics(self.device)
        self.sums, self.window_micro, self.window_clips, self.window_start = {}, 0, 0, time.perf_counter()
        return means

    def checkpoint(self) -> str:
        """Every rank saves its RNG, then rank 0 the rest (``state.json`` last); first every rank refuses an output
        that holds a link (:func:`refuse_output_links`: one may have been put there while it trained)."""
        refuse_output_links(self.cfg.out_dir)
        if self.rank != 0:
            save_rank_rng(self.ckpt_root, self.step, self.rank)
        distributed.barrier()
        data_state = self.data.state_dict() if hasattr(self.data, "state_dict") else None
        extra = {
            "train_config": dataclasses.asdict(self.cfg),
            "optim_config": dataclasses.asdict(self.optim_cfg),
            "identity": self.identity,
            "last_metrics": self.last_metrics,
        }
        uri = ""
        if self.rank == 0:
            uri = save_checkpoint(
                self.ckpt_root, self.step, self.model, self.optimizer, self.scheduler, None, data_state, extra,
                world_size=self.world, keep_last=self.cfg.keep_last,
            )  # fmt: skip
        distributed.barrier()
        return uri


def train(
    model: nn.Module,
    step_fn: StepFn,
    data: Any,
    cfg: TrainConfig,
    optim_cfg: OptimConfig | None = None,
    *,
    metrics_logger: MetricsLogger | None = None,
    resume: bool = True,
    identity: Mapping[str, str] | None = None,
) -> TrainResult:
    """Train ``model`` for ``cfg.max_steps`` optimiser updates (see the module docstring for the contracts).

    Args:
        model: The unwrapped model, already on its device (``cuda:local_rank`` under torchrun).
        step_fn: ``step_fn(model, batch) -> {"loss": ..., other named scalars}``.
        data: Iterable of batches, ideally with ``state_dict()/load_state_dict()`` (exact resume).
        cfg: Loop settings.
        optim_cfg: AdamW / schedule / clipping settings (defaults: :class:`OptimConfig`).
        metrics_logger: Receives metrics on rank 0; default: JSONL at ``<out_dir>/metrics.jsonl``. One with a
            ``rewind(step)`` method is rewound to the step training starts from before anything is logged.
        resume: Continue from the newest complete checkpoint under ``<out_dir>/checkpoints`` if any.
        identity: What the weights are only valid with (e.g. ``{"tokenizer_sha256": ...}``): recorded in every
            checkpoint; a resume from a checkpoint that recorded another value raises ``CheckpointError``.

    Returns:
        :class:`TrainResult` with the final step, the checkpoints involved and the last logged metrics (after
        a resume that had nothing left to do: those recorded in the checkpoint).
    """
    optim_cfg = optim_cfg or OptimConfig()
    seed_everything(cfg.seed + distributed.rank())
    apply_freed_memory(cfg.freed_memory)
    if cfg.grad_checkpointing:
        enable_grad_checkpointing(model)
    if cfg.compile:
        compile_blocks(model)
    run = _Run(model, step_fn, data, cfg, optim_cfg)
    run.identity = dict(identity or {})
    refuse_output_links(cfg.out_dir)  # the readers' rule, before anything is read or written there
    resumed_from = run.resume() if resume else None
    start = run.step
    wrong = "" if bool(all_finite(model.parameters())) else run.nonfinite_weights()
    if wrong:
        raise NonFiniteTrainingError(f"{cfg.name} cannot start from step {start}: {wrong} (the model was built or "
                                     "loaded with them)")  # fmt: skip
    logger = metrics_logger
    if logger is None and run.rank == 0:
        logger = JsonlMetricsLogger(storage.join(cfg.out_dir, "metrics.jsonl"))
    if logger is not None and run.rank == 0 and hasattr(logger, "rewind"):
        logger.rewind(start)  # the steps after the checkpoint are logged again below: keep each step once
    if logger is not None and run.rank == 0 and resumed_from is None:
        logger.log_params({"train": dataclasses.asdict(cfg), "optim": dataclasses.asdict(optim_cfg)})
    # no buffer broadcast: every rank keeps its buffers equal by construction (ALBEF's queues are written from
    # gathered features; 2 x 256 x 65,536 floats would be copied from rank 0 at every forward otherwise)
    ddp_model = distributed.wrap_ddp(model, broadcast_buffers=False)
    model.train()
    result = TrainResult(start, start, resumed_from, resumed_from, dict(run.last_metrics))
    if resumed_from is not None and run.rank == 0:
        said = "nothing left to train" if start >= cfg.max_steps else f"training to step {cfg.max_steps}"
        print(f"{cfg.name}: resuming from step {start} ({resumed_from}); {said}", file=sys.stderr, flush=True)
    progress = _Progress(cfg, start, run.rank)
    try:
        while run.step < cfg.max_steps:
            grad_norm = run.update(ddp_model)
            if run.step % cfg.log_every == 0 or run.step == cfg.max_steps:
                result.last_metrics = run.last_metrics = run.metrics(grad_norm)
                if logger is not None and run.rank == 0:
                    logger.log_metrics(result.last_metrics, run.step)
                progress.logged(run.step, result.last_metrics)
            if (cfg.ckpt_every and run.step % cfg.ckpt_every == 0) or run.step == cfg.max_steps:
                result.checkpoint = run.checkpoint() or result.checkpoint
            progress.update()
    except KeyboardInterrupt as exc:
        progress.close()
        resume_step, newest = _newest_checkpoint(run.ckpt_root, result.checkpoint)
        signum = int(getattr(exc, "signum", signal.SIGINT))
        raise TrainingInterrupted(run.step, resume_step, newest, signum) from exc
    finally:
        close = getattr(data, "close", None)
        if callable(close):
            close()  # e.g. SamplerBatches' worker processes: none outlives the training
    progress.close()
    result.step = run.step
    return result


def _everywhere(ok: Tensor) -> bool:
    """True when the 0-d bool ``ok`` is True on every rank (one synchronisation; one all-reduce under DDP)."""
    return bool(distributed.all_reduce_mean(ok.float()).item() == 1.0)


def _newest_checkpoint(root: str, known: str | None) -> tuple[int, str | None]:
    """``(step, uri)`` of the newest complete checkpoint under ``root`` (``(0, None)``: none); when it cannot be
    listed, ``known`` (the one this run wrote or resumed from last)."""
    found = _listed(root)
    if found is None:  # e.g. an unreachable bucket: say what this run knows
        return (checkpoint_step(known), known) if known else (0, None)
    return found[-1] if found else (0, None)


def _listed(root: str) -> list[tuple[int, str]] | None:
    """:func:`list_checkpoints` of ``root``, or None when it cannot be listed (said while failing for another
    reason: that reason is the error to raise)."""
    try:
        return list_checkpoints(root)
    except Exception:
        return None


def format_duration(seconds: float) -> str:
    """``512`` -> ``"8m32s"``, ``7384`` -> ``"2h03m"``, ``9.4`` -> ``"9s"``."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_line(name: str, step: int, max_steps: int, metrics: Mapping[str, float], sec_per_step: float) -> str:
    """One log-friendly progress line, e.g. ``pretrain step 40/200 (20%) loss 2.3100 lr 1.0e-04 3.2 s/it eta
    8m32s`` (the loss and lr are the logged window's, s/it the mean wall time per update since the last line)."""
    parts = [f"{name} step {step}/{max_steps} ({100 * step // max_steps}%)"]
    if "train/loss" in metrics:
        parts.append(f"loss {metrics['train/loss']:.4f}")
    if "train/lr" in metrics:
        parts.append(f"lr {metrics['train/lr']:.1e}")
    parts.append(f"{sec_per_step:.3g} s/it eta {format_duration(sec_per_step * (max_steps - step))}")
    return " ".join(parts)


class _Progress:
    """Rank 0's progress display: a tqdm bar when stderr is a terminal, else :func:`progress_line` at every logged
    step; nothing with ``cfg.progress`` false or on other ranks."""

    def __init__(self, cfg: TrainConfig, start: int, rank: int) -> None:
        self.name, self.max_steps = cfg.name, cfg.max_steps
        show = cfg.progress and rank == 0
        self.lines = show and not _stderr_is_tty()
        self.bar = None
        if show and not self.lines:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=cfg.max_steps, initial=start, desc=cfg.name, unit="step")
        self.since_step, self.since = start, time.perf_counter()

    def logged(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
        if self.lines:
            now = time.perf_counter()
            per_step = (now - self.since) / max(step - self.since_step, 1)
            self.since_step, self.since = step, now
            print(progress_line(self.name, step, self.max_steps, metrics, per_step), file=sys.stderr, flush=True)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
