"""Training components: pretrain_prompter, build_prompt_bank (CPU), pretrain, finetune_retrieval/qa (GPU image).

``nproc`` > 1 runs the step's CLI under ``torchrun --nproc-per-node nproc`` inside the container (one node,
one process per GPU); the pipeline sets it from the step's ``accelerator_count``. ``launch`` (from a step's
``num_nodes > 1``, ``pipelines.config.launch_settings``) runs it on that many nodes as a Kubeflow Trainer
``TrainJob`` instead (``components/trainjob.py``), which the step's pod creates, follows and cleans up.
"""

import functools

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.images import CPU_IMAGE, GPU_IMAGE

component = functools.partial(dsl.component, base_image=GPU_IMAGE, install_kfp_package=False)
cpu_component = functools.partial(dsl.component, base_image=CPU_IMAGE, install_kfp_package=False)


@component
def pretrain_prompter(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    prompter: Output[Model],
    config: str,
    overrides: list[str],
    data_root: str = "",
    nproc: int = 1,
    launch: dict = {},  # noqa: B006 (KFP reads the default; it is never mutated)
) -> None:
    """Train ALPRO's prompter (video-text dual encoder, VTC only).

    Args:
        dataset: The ingested dataset.
        frames: The extracted frames.
        prompter: ``model.json``, ``tokenizer/``, ``checkpoints/``, ``metrics.jsonl``.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
        nproc: Training processes on this node (torchrun when > 1).
        launch: Multi-node TrainJob settings ({} = train in this pod).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.pretrain import pretrain_prompter as step

    ds, fr, out = location(dataset), location(frames), output_location(prompter, data_root)
    cli = ["pretrain-prompter", "--dataset", ds, "--frames", fr, "--out", out]
    Step("pretrain_prompter", config, overrides, nproc, launch).run(lambda cfg: step(ds, fr, out, cfg), cli, out)


@cpu_component
def build_prompt_bank(
    prompter: Input[Model],
    entities: Input[Dataset],
    bank: Output[Model],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Embed 12 video + 12 image templates x the top-M entities with the frozen prompter.

    Args:
        prompter: The pretrain_prompter output.
        entities: The mine_entities output.
        bank: ``prompt_bank.safetensors`` + ``prompt_bank.json``.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.pretrain import build_prompt_bank as step

    pr, en, out = location(prompter), location(entities), output_location(bank, data_root)
    Step("build_prompt_bank", config, overrides).run(lambda cfg: step(pr, en, out, cfg))


@component
def pretrain(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    model: Output[Model],
    config: str,
    overrides: list[str],
    prompter: Input[Model] = None,
    bank: Input[Model] = None,
    family: str = "alpro",
    data_root: str = "",
    nproc: int = 1,
    launch: dict = {},  # noqa: B006 (KFP reads the default; it is never mutated)
) -> None:
    """Pre-train a video-language model of ``family`` (ALPRO: VTC + PEM + MLM + VTM; ALBEF: ITC + MLM + ITM).

    Args:
        dataset: The ingested dataset.
        frames: The extracted frames.
        model: ``model.json``, ``tokenizer/``, ``checkpoints/``, ``metrics.jsonl``.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        prompter: The pretrain_prompter output (ALPRO's PEM pseudo-labels; none for ALBEF).
        bank: The build_prompt_bank output (ALPRO).
        family: Model family (``alpro``, ``albef``).
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
        nproc: Training processes on this node (torchrun when > 1).
        launch: Multi-node TrainJob settings ({} = train in this pod).
    """
    from components._runtime import Step, location, output_location, pretrain_fn

    step = pretrain_fn(family)
    ds, fr = location(dataset), location(frames)
    pr, bk = (location(prompter), location(bank)) if prompter is not None else ("", "")
    out = output_location(model, data_root)
    cli = ["pretrain", "--model", family, "--dataset", ds, "--frames", fr]
    cli += ["--prompter", pr, "--prompt-bank", bk] if pr else []
    run = Step("pretrain", config, [*overrides, f"model.family={family}"], nproc, launch).run
    run(lambda cfg: step(ds, fr, pr, bk, out, cfg), [*cli, "--out", out], out)


@component
def finetune_retrieval(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    model: Output[Model],
    config: str,
    overrides: list[str],
    pretrained: Input[Model] = None,
    family: str = "",
    data_root: str = "",
    nproc: int = 1,
    launch: dict = {},  # noqa: B006 (KFP reads the default; it is never mutated)
) -> None:
    """Fine-tune a model for text-video retrieval: from a pre-trained one, or (no ``pretrained``) from the step
    config's ``model`` section of ``family`` (TS2-Net: CLIP's weights).

    Args:
        dataset: The ingested dataset (its train split).
        frames: The extracted frames.
        model: The fine-tuned model dir.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        pretrained: The pretrain output; None = start from the ``model`` section.
        family: Without ``pretrained``: the model family (``""`` = the config's ``model.family``).
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
        nproc: Training processes on this node (torchrun when > 1).
        launch: Multi-node TrainJob settings ({} = train in this pod).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.finetune import finetune_retrieval as step

    ds, fr, out = location(dataset), location(frames), output_location(model, data_root)
    pt = location(pretrained) if pretrained is not None else ""
    cli = ["finetune-retrieval", "--dataset", ds, "--frames", fr, "--out", out] + (["--pretrained", pt] if pt else [])
    extra = [f"model.family={family}"] if family and not pt else []
    run = Step("finetune_retrieval", config, [*overrides, *extra], nproc, launch).run
    run(lambda cfg: step(ds, fr, pt, out, cfg), cli, out)


@component
def finetune_qa(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    pretrained: Input[Model],
    model: Output[Model],
    config: str,
    overrides: list[str],
    data_root: str = "",
    nproc: int = 1,
    launch: dict = {},  # noqa: B006 (KFP reads the default; it is never mutated)
) -> None:
    """Fine-tune a pre-trained model for open-ended video QA.

    Args:
        dataset: The ingested dataset (its train split).
        frames: The extracted frames.
        pretrained: The pretrain output.
        model: The fine-tuned model dir.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
        nproc: Training processes on this node (torchrun when > 1).
        launch: Multi-node TrainJob settings ({} = train in this pod).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.finetune import finetune_qa as step

    ds, fr, pt, out = location(dataset), location(frames), location(pretrained), output_location(model, data_root)
    cli = ["finetune-qa", "--dataset", ds, "--frames", fr, "--pretrained", pt, "--out", out]
    run = Step("finetune_qa", config, overrides, nproc, launch).run
    run(lambda cfg: step(ds, fr, pt, out, cfg), cli, out)
