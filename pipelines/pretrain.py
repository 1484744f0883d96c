"""The pre-training DAGs: one per registered model family that pre-trains (``vlp-pretrain`` for the default
family, ALPRO; ``vlp-pretrain-<family>`` for the others, e.g. ``vlp-pretrain-albef``).

synth (or an existing raw dataset) -> ingest -> extract_frames, [the steps the family's spec declares it needs
before pre-training (``FamilySpec.prepared``; ALPRO: mine_entities -> pretrain_prompter -> build_prompt_bank)] ->
pretrain (the component :data:`PRETRAIN` names for the family, else the shared one) ->
finetune_retrieval -> evaluate_retrieval and index_clips (the retrieval test split's clips into a clip index that
``vlp search`` reads) and, for a family with QA (its spec's ``tasks``), finetune_qa -> evaluate_qa in parallel ->
report. An MLflow parent run opens first and an exit handler closes it FINISHED or FAILED. Per-step resources,
images, caching and retries come from a :class:`pipelines.config.PipelineConfig`, never from the environment at
compile time.
"""

from typing import Any

from kfp import dsl

from components import data, evaluation, reporting, training
from components.index import index_clips
from pipelines import fanout
from pipelines.config import PipelineConfig, configure, scale
from vlp.models.family import DEFAULT_FAMILY, FamilySpec, specs

NAME = "vlp-pretrain"
# The KFP component of each step a family's pre-training DAG runs before pre-training (``Prepared.step`` in its
# spec): the library names steps, the DAG side maps them to components. A family outside vlp adds its own here.
COMPONENTS: dict[str, Any] = {
    "mine_entities": data.mine_entities,
    "pretrain_prompter": training.pretrain_prompter,
    "build_prompt_bank": training.build_prompt_bank,
}
# A family's own pre-training component, where the shared one (``training.pretrain``, which reads ``prompter`` and
# ``bank``) does not take what its pre-training reads: it takes ``dataset``, ``frames``, one input per name of the
# family's ``pretrain_inputs``, ``family`` and the steps' ``config``, ``overrides``, ``data_root``, ``nproc``,
# ``launch``.
PRETRAIN: dict[str, Any] = {}


def families() -> dict[str, FamilySpec]:
    """The registered families that pre-train: one compiled DAG each."""
    return {name: spec for name, spec in specs().items() if spec.pretrains}


def name_of(family: str) -> str:
    """The pipeline's name for a model family (``vlp-pretrain`` is the default family's)."""
    return NAME if family == DEFAULT_FAMILY else f"{NAME}-{family}"


def component(step: str) -> Any:
    """The KFP component of a step a family's spec declares (:data:`COMPONENTS`)."""
    if step not in COMPONENTS:
        raise ValueError(f"no KFP component for step {step!r}: add it to pipelines.pretrain.COMPONENTS")
    return COMPONENTS[step]


def pretrain_component(spec: FamilySpec) -> Any:
    """The component that pre-trains ``spec``'s family; it must take every input the family's pre-training reads."""
    found = PRETRAIN.get(spec.name, training.pretrain)
    missing = [name for name in spec.pretrain_inputs if name not in found.component_spec.inputs]
    if missing:
        raise ValueError(
            f"{spec.name}: the pretrain component {found.name} takes no input {missing}: give the family its own "
            "(pipelines.pretrain.PRETRAIN)"
        )
    return found


def build(cfg: PipelineConfig, family: str = DEFAULT_FAMILY) -> Any:
    """The pre-training pipeline of ``family`` for ``cfg``: the steps its spec declares (``prepared``; ALPRO: its
    entities, prompter and prompt bank), then pre-training (ALBEF: straight from the frames)."""
    known = families()
    if family not in known:
        raise ValueError(f"no pre-training DAG for model family {family!r}; choose one of {sorted(known)}")
    spec = known[family]
    pretrain = pretrain_component(spec)
    steps = "".join(f"{one.title or one.name} -> " for one in spec.prepared if one.flag)

    @dsl.pipeline(name=name_of(family), description=f"vlp pre-training ({family}): data -> {steps}pretrain -> eval")
    @fanout.parameters(cfg)
    def vlp_pretrain(
        config: str = cfg.step_config,
        overrides: list[str] = [],  # noqa: B006 (KFP reads the default; it is never mutated)
        source_uri: str = "",
        url_list: str = "",
        data_root: str = cfg.data_root,
        register_alias: str = "candidate",
        data_parts: int = cfg.fanout.parts,
    ) -> None:
        """Args: config = vlp step config (path in the image or YAML text); overrides = section.key=value list;
        source_uri = raw dataset to ingest ("" = a fresh synthetic world); url_list = a list of video URLs (WebVid
        CSV, url list) to fetch and ingest instead of source_uri ("" = none); data_root = s3:// prefix for large
        outputs ("" = KFP artifacts); register_alias = alias of new models; data_parts = pods for fetch, ingest and
        extract_frames each (in a DAG compiled with fanout.parts > 1 only)."""
        common = {"config": config, "overrides": overrides}
        stored = {**common, "data_root": data_root}
        finish = configure(reporting.finish_run(**common), cfg, "finish_run")
        with dsl.ExitHandler(finish, name="tracked-run"):
            start = reporting.start_run(**common, pipeline=name_of(family), image=cfg.image("pretrain"))
            configure(start, cfg, "start_run")
            given = fanout.source(cfg, url_list, source_uri, stored, data_parts, start)
            raw = configure(data.synth(**stored, source_uri=given).after(start), cfg, "synth")
            ds, fr = fanout.data_steps(cfg, raw.outputs["raw"], stored, data_parts)
            made = prepared_steps(cfg, spec, {"dataset": ds, "frames": fr}, stored)
            inputs = {name: made[name] for name in spec.pretrain_inputs}
            model = pretrain(dataset=ds, frames=fr, **inputs, family=family, **stored, **scale(cfg, "pretrain"))
            pretrained = configure(model, cfg, "pretrain").outputs["model"]
            branches = _downstream(cfg, known[family].tasks, ds, fr, pretrained, stored) if cfg.downstream else {}
            summary = reporting.report(
                pretrained=pretrained,
                **common,
                register_prefix=cfg.register_prefix,
                register_alias=register_alias,
                **branches,
            )
            configure(summary, cfg, "report")

    return vlp_pretrain


def prepared_steps(cfg: PipelineConfig, spec: FamilySpec, made: dict[str, Any], stored: dict[str, Any]) -> dict:
    """The tasks of the steps ``spec`` declares before pre-training, in order, each given what it reads of
    ``made`` (the data steps' outputs, then each step's own); returns ``made`` with every step's output added."""
    made = dict(made)
    for one in spec.prepared:
        reads = {name: made[name] for name in one.reads}
        task = component(one.step)(**reads, **stored, **(scale(cfg, one.step) if one.trains else {}))
        made[one.name] = configure(task, cfg, one.step).outputs[one.name]
    return made


def _downstream(
    cfg: PipelineConfig, tasks: tuple[str, ...], ds: Any, fr: Any, pretrained: Any, stored: dict[str, Any]
) -> dict[str, Any]:
    """finetune_<task> -> evaluate_<task> for each of the family's ``tasks`` (retrieval, QA: in parallel), and
    index_clips over the retrieval model; the report's inputs."""
    branches: dict[str, Any] = {}
    for task, finetune, evaluate in (
        ("retrieval", training.finetune_retrieval, evaluation.evaluate_retrieval),
        ("qa", training.finetune_qa, evaluation.evaluate_qa),
    ):
        if task not in tasks:
            continue
        tuned = finetune(dataset=ds, frames=fr, pretrained=pretrained, **stored, **scale(cfg, f"finetune_{task}"))
        model = configure(tuned, cfg, f"finetune_{task}").outputs["model"]
        scored = configure(evaluate(dataset=ds, frames=fr, model=model, **stored), cfg, f"evaluate_{task}")
        branches[f"{task}_results"], branches[f"{task}_model"] = scored.outputs["results"], model
        if task == "retrieval":
            branches["retrieval_index"] = clip_index(cfg, ds, fr, model, stored)
    return branches


def clip_index(cfg: PipelineConfig, ds: Any, fr: Any, model: Any, stored: dict[str, Any]) -> Any:
    """index_clips: the clips of the retrieval test split (``retrieval.split``) encoded by ``model``, so that a
    finished run is searchable; its ``index`` output (under ``data_root`` when set)."""
    return configure(index_clips(dataset=ds, frames=fr, model=model, **stored), cfg, "index_clips").outputs["index"]
