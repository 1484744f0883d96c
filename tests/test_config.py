from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from vlp.config import Config, ConfigError, from_dict, load_config, parse_override
from vlp.schema import MAX_YAML_CHARS, NONFINITE, nonfinite_values

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Inner:
    size: int = 224
    ratio: float = 0.5
    mode: Literal["stretch", "crop"] = "stretch"
    names: list[str] = field(default_factory=lambda: ["a"])
    maybe: int | None = None
    flag: bool = False


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    name: str = "x"


def test_defaults_and_nested_values():
    cfg = from_dict(Outer, {"inner": {"size": 64, "ratio": 1, "names": ["b", "c"], "maybe": 3}, "name": "y"})
    assert cfg == Outer(Inner(size=64, ratio=1.0, names=["b", "c"], maybe=3), "y")
    assert isinstance(cfg.inner.ratio, float)  # ints are accepted for floats and converted


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"inner": {"sise": 3}}, "inner.sise"),
        ({"nmae": "x"}, "'nmae'"),
        ({"inner": {"size": "big"}}, "inner.size: expected an integer"),
        ({"inner": {"size": 2.5}}, "inner.size: expected an integer"),
        ({"inner": {"size": True}}, "inner.size: expected an integer"),
        ({"inner": {"ratio": "half"}}, "inner.ratio: expected a number"),
        ({"inner": {"mode": "zoom"}}, "inner.mode: 'zoom' is not one of"),
        ({"inner": {"names": "a"}}, "inner.names: expected a list"),
        ({"inner": {"names": ["a", 1]}}, "inner.names[1]: expected a string"),
        ({"inner": {"flag": "yes"}}, "inner.flag: expected true/false"),
        ({"inner": {"maybe": "x"}}, "inner.maybe"),
        ({"inner": 5}, "inner: expected a mapping"),
    ],
)
def test_bad_keys_and_types_name_the_key(data, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        from_dict(Outer, data)
    assert fragment in str(info.value)


def test_optional_accepts_none():
    assert from_dict(Outer, {"inner": {"maybe": None}}).inner.maybe is None


def test_parse_override_uses_yaml_scalars():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=0.5") == ("a.b", 0.5)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=[x, y]") == ("a.b", ["x", "y"])
    assert parse_override("a.b=http://h:1/x") == ("a.b", "http://h:1/x")
    assert parse_override("a.b=") == ("a.b", "")
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("no-equals-sign")


def test_load_config_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("frames:\n  num_frames: 4\nstorage:\n  region: eu-west-1\n")
    cfg = load_config(path, ["frames.num_frames=8", "storage.endpoint_url=http://127.0.0.1:1"])
    assert cfg.frames.num_frames == 8  # the override wins over the file
    assert cfg.storage.region == "eu-west-1"
    assert cfg.storage.endpoint_url == "http://127.0.0.1:1"


def test_load_config_rejects_unknown_override_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match=r"frames\.num_framez"):
        load_config(None, ["frames.num_framez=3"])
    with pytest.raises(ConfigError, match="unknown config key 'bogus'"):
        load_config(None, ["bogus.x=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("frames: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML"):
        load_config(broken)


# speed switches that are gone (docs/results/speed.md: none moved a training step by 10% or more on every CPU measured)
REMOVED_KEYS = [
    "pretrain.cpu_linear",
    "retrieval.cpu_dropout",
    "model.alpro.pem_prompter_precision",
    "model.alpro.pem_prompter_size",
    "model.alpro.vtm_fusion",
    "retrieval.matching_fusion",
]


@pytest.mark.parametrize("key", REMOVED_KEYS)
def test_a_removed_switch_is_an_unknown_key_in_a_file_and_an_override(key, tmp_path):
    section, name = key.rsplit(".", 1)
    with pytest.raises(ConfigError, match=rf"^unknown config key '{key}' in section '{section}'; valid keys: \["):
        load_config(None, [f"{key}=x"])
    path = tmp_path / "old.yaml"
    path.write_text("".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split("."))) + \
                    f"{'  ' * (section.count('.') + 1)}{name}: x\n")  # fmt: skip
    with pytest.raises(ConfigError, match=rf"unknown config key '{key}'"):
        load_config(path)


def test_cli_reports_a_broken_config_file_in_one_line(tmp_path, capsys):
    from vlp.cli import main

    broken = tmp_path / "broken.yaml"
    broken.write_text("frames: [1, 2\n")
    args = ["extract-frames", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), "--config", str(broken)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and len(err.strip().splitlines()) == 1


def test_a_missing_config_file_is_one_line_that_names_it(tmp_path, capsys):
    from vlp.cli import main

    for path, what in ((tmp_path / "nope.yaml", "does not exist"), (tmp_path, "is a directory")):
        args = ["extract-frames", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), "--config", str(path)]
        assert main(args) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == f"vlp extract-frames: error: config file {path} {what}: --config takes a YAML file, e.g. " \
            "configs/default.yaml"  # fmt: skip
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["tiny.yaml", "default.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert isinstance(cfg, Config)


LAYERED = sorted(p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").glob("*/*.yaml"))


@pytest.mark.parametrize("name", LAYERED)
def test_every_paper_row_layers_over_the_default_config(name):
    """configs/finetune/*.yaml (ALPRO), configs/albef/*.yaml, configs/ts2net/*.yaml: strict keys, and the model each
    row describes builds."""
    cfg = load_config([REPO / "configs" / "default.yaml", REPO / "configs" / name])
    if name.startswith("albef/"):
        from vlp.models.albef.model import FAMILY

        albef = FAMILY.config(dataclasses.replace(cfg.model, family="albef"), 30522)
        if name == "albef/pretrain-4m.yaml":
            assert (albef.queue_size, albef.momentum) == (65536, 0.995)
            assert albef.video.init == "deit_base_patch16_224.fb_in1k" and albef.text.init == "bert-base-uncased"
            assert cfg.pretrain.schedule == "cosine" and cfg.pretrain.weight_decay == 0.02
            albef.check_queue(512)  # the paper's global batch divides the queue
        else:
            task = "qa" if name == "albef/vqa.yaml" else "retrieval"
            tuned = FAMILY.task_config(albef, task, getattr(cfg, task))
            assert tuned.alpha_ramp_steps == -1  # one epoch, resolved when the data is known
            if task == "retrieval":
                assert tuned.losses == ("itc", "itm") and tuned.same_video == "positive"
    if name.startswith("ts2net/"):
        from vlp.models.ts2net.model import FAMILY as TS2NET

        layered = [
            REPO / "configs" / "default.yaml",
            REPO / "configs" / "ts2net" / "msrvtt.yaml",
            REPO / "configs" / name,
        ]
        ts2 = TS2NET.task_config(TS2NET.config(load_config(layered).model, 49408), "retrieval", cfg.retrieval)
        assert ts2.video.init == "openai/clip-vit-base-patch32" and ts2.aggregator_layers == 4


# --------------------------------------------------------------------------- value ranges


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("pretrain.batch_size=0", "pretrain.batch_size=0 must be >= 1"),
        ("pretrain.max_steps=-1", "pretrain.max_steps=-1 must be >= 1"),
        ("pretrain.max_steps=0", "pretrain.max_steps=0 must be >= 1"),
        ("pretrain.lr=-0.001", "pretrain.lr=-0.001 must be > 0"),
        ("pretrain.ckpt_every=-5", "pretrain.ckpt_every=-5 must be >= 0 (0 = at the end only)"),
        ("pretrain.betas=[0.9, 1.0]", "pretrain.betas=[0.9, 1.0] must be two values in [0, 1)"),
        ("retrieval.max_steps=-1", "retrieval.max_steps=-1 must be >= 0 (0 = epochs x updates per epoch)"),
        ("retrieval.epochs=0", "retrieval.epochs=0.0 must be > 0"),
        ("retrieval.eval_batch_size=0", "retrieval.eval_batch_size=0 must be >= 1"),
        ("qa.batch_size=-4", "qa.batch_size=-4 must be >= 1"),
        ("qa.log_every=0", "qa.log_every=0 must be >= 1"),
        ("qa.num_frames=0", "qa.num_frames=0 must be >= 1"),
        ("model.num_frames=0", "model.num_frames=0 must be >= 1"),
        ("model.img_size=-32", "model.img_size=-32 must be >= 1"),
        (
            "model.pixel_std=[0.5, 0.0, 0.5]",
            "model.pixel_std=[0.5, 0.0, 0.5] must be [] (the family's) or 3 values > 0",
        ),
        ("frames.workers=-1", "frames.workers=-1 must be >= 0 (0 = one per CPU core)"),
        ("frames.size=0", "frames.size=0 must be >= 8"),
        ("entities.n_process=0", "entities.n_process=0 must be >= 1, or -1 for one per CPU"),
        ("storage.max_attempts=0", "storage.max_attempts=0 must be >= 1"),
        ("tracking.timeout_s=0", "tracking.timeout_s=0.0 must be > 0"),
        ("synth.workers=0", "synth.workers must be >= 1"),
    ],
)
def test_a_value_out_of_range_fails_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "tiny.yaml", [override])
    assert str(info.value) == f"invalid config: {message}"


def test_every_value_out_of_range_is_named_in_one_line_and_edges_that_mean_something_load():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["pretrain.batch_size=0", "qa.max_steps=-1", "frames.jpeg_quality=96"])
    message = str(info.value)
    assert "\n" not in message
    for fragment in ("pretrain.batch_size=0 must be", "qa.max_steps=-1 must be", "frames.jpeg_quality=96 must be"):
        assert fragment in message
    edges = ["retrieval.max_steps=0", "pretrain.ckpt_every=0", "frames.workers=0", "entities.n_process=-1",
             "model.albef.alpha_ramp_steps=-1", "model.albef.queue_size=0", "tracking.retries=0"]  # fmt: skip
    cfg = load_config(None, edges)
    albef = cfg.model.families["albef"]
    assert (cfg.retrieval.max_steps, cfg.entities.n_process, albef.alpha_ramp_steps, albef.queue_size) == (0, -1, -1, 0)


NOT_RANGED = {  # numbers that may take any value, or that their own module checks
    "pretrain.seed", "retrieval.seed", "qa.seed", "pretrain.grad_clip", "retrieval.grad_clip", "qa.grad_clip",
    "model.ts2net.frame_lambda",
}  # fmt: skip
SELF_CHECKED = {"synth", "ingest"}  # SynthConfig.validate (called by validate), vlp.data.ingest at its step's start


def test_every_count_size_and_rate_of_every_section_has_a_range():
    """Each number of every section (each family's too) declares its range beside its key (vlp.ranges.ranged), or
    is listed in NOT_RANGED; the defaults are in range."""
    from vlp.ranges import ranges_of

    unranged = []
    sections = {s.name: getattr(Config(), s.name) for s in dataclasses.fields(Config) if s.name not in SELF_CHECKED}
    sections |= {f"model.{name}": own for name, own in Config().model.families.items()}  # each family's section
    for name, section in sections.items():
        hints = typing.get_type_hints(type(section))
        ranges = ranges_of(section)
        for f in dataclasses.fields(section):
            numeric = hints[f.name] in (int, float) or typing.get_args(hints[f.name]) == (float,)
            key = f"{name}.{f.name}"
            if numeric and f.name not in ranges and key not in NOT_RANGED:
                unranged.append(key)
    assert not unranged, f"give {unranged} a range (vlp.ranges.ranged) or list them in NOT_RANGED"
    from vlp.config import validate

    validate(Config())


def test_a_range_declared_beside_a_key_is_checked_in_every_section_that_inherits_it():
    """``lr``'s range is declared once for the training sections (OptimSettings): QA fine-tuning, which sets a new
    default without a range, keeps it; ``max_steps`` is a count in pre-training and 0 (epochs) is allowed in
    fine-tuning, which declares its own range."""
    from vlp.config import ConfigError, load_config
    from vlp.ranges import RATE, ranges_of
    from vlp.settings import FinetuneConfig, PretrainConfig, QAConfig

    for section in (PretrainConfig, FinetuneConfig, QAConfig):
        assert ranges_of(section)["lr"] is RATE
    for name in ("pretrain", "retrieval", "qa"):
        with pytest.raises(ConfigError, match=rf"{name}\.lr=0\.0 must be > 0"):
            load_config(None, [f"{name}.lr=0"])
    assert "lr" in inspect.get_annotations(QAConfig)  # redeclared, without a range of its own
    with pytest.raises(ConfigError, match=r"pretrain\.max_steps=0 must be >= 1"):
        load_config(None, ["pretrain.max_steps=0"])
    assert load_config(None, ["qa.max_steps=0"]).qa.max_steps == 0


def test_every_step_validates_a_config_built_in_code_before_it_writes(tmp_path):
    """run_step checks the whole config first: a Config made in code (no load_config) with a count out of range
    fails a data step too, before the step opens its source or writes its output."""
    from vlp.steps.extract_frames import extract_frames
    from vlp.steps.ingest import ingest

    cfg = Config()
    cfg.storage.max_attempts = 0
    for step in (ingest, extract_frames):
        with pytest.raises(ConfigError, match=r"^invalid config: storage\.max_attempts=0 must be >= 1$"):
            step(str(tmp_path / "missing-source"), str(tmp_path / "out"), cfg)
    assert not (tmp_path / "out").exists()


def test_sampling_more_frames_than_extract_frames_stores_fails_naming_both_keys(tmp_path):
    from vlp.config import check_sampled_frames
    from vlp.steps.common import run_step

    tiny = REPO / "configs" / "tiny.yaml"
    check_sampled_frames(load_config(tiny, ["model.num_frames=8"]), "pretrain")  # = stored: fine
    with pytest.raises(ConfigError, match=r"model\.num_frames=9 is more than frames\.num_frames=8.*re-run extract"):
        check_sampled_frames(load_config(tiny, ["model.num_frames=9"]), "pretrain")
    with pytest.raises(ConfigError, match=r"qa\.num_frames=16 is more than frames\.num_frames=12"):
        check_sampled_frames(load_config(REPO / "configs" / "ts2net" / "msrvtt.yaml"), "qa")
    check_sampled_frames(load_config(REPO / "configs" / "ts2net" / "msrvtt.yaml"), "retrieval")  # what it runs
    check_sampled_frames(load_config(tiny, ["model.num_frames=9"]), "frames")  # extract-frames samples nothing
    with pytest.raises(ConfigError, match=r"model\.num_frames=9"):  # a step checks before it runs or writes
        run_step("pretrain", str(tmp_path / "out"), load_config(tiny, ["model.num_frames=9"]), "pretrain", dict)
    assert not (tmp_path / "out").exists()


def test_the_training_schedule_is_declared_once_and_reaches_the_loop_as_is(caplog):
    from vlp.settings import LoopSettings, OptimSettings, TrainingSchedule
    from vlp.train.loop import TrainConfig
    from vlp.train.optim import OptimConfig

    overrides = ["retrieval.keep_last=5", "retrieval.grad_checkpointing=true", "retrieval.max_steps=7"]
    overrides.append("qa.betas=[0.8, 0.9]")
    cfg = load_config(None, overrides)
    for section in (cfg.pretrain, cfg.retrieval, cfg.qa):
        assert isinstance(section, TrainingSchedule)
    loop, optim = TrainConfig.of(cfg.retrieval, "/tmp/x", "finetune_retrieval"), OptimConfig.of(cfg.qa)
    assert (loop.keep_last, loop.grad_checkpointing, loop.name, loop.out_dir) == (
        5,
        True,
        "finetune_retrieval",
        "/tmp/x",
    )
    assert all(getattr(loop, f.name) == getattr(cfg.retrieval, f.name) for f in dataclasses.fields(LoopSettings))
    assert all(getattr(optim, f.name) == getattr(cfg.qa, f.name) for f in dataclasses.fields(OptimSettings))
    assert optim.betas == [0.8, 0.9] and (cfg.pretrain.lr, cfg.retrieval.lr, cfg.qa.lr) == (1e-4, 2.5e-5, 5e-5)
    with pytest.raises(ConfigError, match=r"retrieval.keep_last=0 must be >= 1"):
        load_config(None, ["retrieval.keep_last=0"])
    with caplog.at_level("WARNING", logger="vlp"):  # the key before weight_decay: 0 meant the same
        old = load_config(None, ["pretrain.alpro_code_weight_decay=true", "qa.alpro_code_weight_decay=false"])
    assert (old.pretrain.weight_decay, old.qa.weight_decay) == (0.0, 1e-3)
    assert "pretrain.alpro_code_weight_decay is gone: pretrain.weight_decay: 0" in caplog.text
    with pytest.raises(ConfigError, match=r"alpro_code_weight_decay=true \(no weight decay\) and pretrain.weight_deca"):
        load_config(None, ["pretrain.alpro_code_weight_decay=true", "pretrain.weight_decay=0.01"])


# --------------------------------------------------------------------------- the retrieval section's old names

# The retrieval section as it was written in ALPRO's words (issue 25), and the same settings in the shared words
OLD_RETRIEVAL = {"losses": ["vtm", "vtc"], "k": 8, "score_rule": "itm_plus_sim", "vtm_negatives": "mixed",
                 "vtm_hard_fraction": 0.25, "same_video_vtc": "positive", "same_video_vtm": "exclude"}  # fmt: skip
NEW_RETRIEVAL = {"losses": ["matching", "contrastive"], "rerank_k": 8, "score_rule": "match_plus_sim",
                 "matching_negatives": "mixed", "matching_hard_fraction": 0.25, "same_clip_contrastive": "positive",
                 "same_clip_matching": "exclude"}  # fmt: skip


def _write(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_an_old_vocabulary_retrieval_section_loads_as_the_new_one_with_a_warning_naming_each_new_key(tmp_path, caplog):
    from vlp.settings import RetrievalConfig

    new_file = _write(tmp_path / "new.yaml", {"retrieval": NEW_RETRIEVAL})
    with caplog.at_level("WARNING", logger="vlp"):
        new = load_config(new_file)
    assert not caplog.text  # the new words load quietly
    assert new.retrieval != RetrievalConfig()  # every value is one the default does not have
    assert all(getattr(new.retrieval, key) != getattr(RetrievalConfig(), key) for key in NEW_RETRIEVAL)
    with caplog.at_level("WARNING", logger="vlp"):
        old = load_config(_write(tmp_path / "old.yaml", {"retrieval": OLD_RETRIEVAL}))
    assert old.retrieval == new.retrieval
    for was, now in RetrievalConfig.RENAMED.items():
        assert f"config key retrieval.{was} is now retrieval.{now}" in caplog.text
    assert "retrieval.losses=[vtm, vtc] is now retrieval.losses=[matching, contrastive]" in caplog.text
    assert "retrieval.score_rule=itm_plus_sim is now retrieval.score_rule=match_plus_sim" in caplog.text
    assert load_config(None, ["retrieval.losses=[itc, itm]", "retrieval.score_rule=itm"]).retrieval == RetrievalConfig(
        losses=["contrastive", "matching"], score_rule="match"
    )  # ALBEF's loss names were the section's too
    # an old key given with its new one: the same value loads, different values are an error naming both
    assert from_dict(Config, {"retrieval": {"k": 8, "rerank_k": 8}}).retrieval.rerank_k == 8
    with pytest.raises(ConfigError, match=r"retrieval\.vtm_negatives='uniform' and retrieval\.matching_negatives='mi"):
        load_config(_write(tmp_path / "both.yaml", {"retrieval": {**NEW_RETRIEVAL, "vtm_negatives": "uniform"}}))
    with pytest.raises(ConfigError, match=r"retrieval\.losses\[0\]: 'mlm' is not one of \['contrastive', 'matching'"):
        load_config(None, ["retrieval.losses=[mlm]"])
    # ranges apply under the new name, whichever name gave the value
    with pytest.raises(ConfigError, match=r"retrieval\.matching_hard_fraction=2\.0 must be"):
        load_config(None, ["retrieval.vtm_hard_fraction=2"])


def test_a_later_file_or_override_replaces_an_earlier_value_given_under_the_keys_other_name(tmp_path):
    """Layers merge key by key: an old-named key in a later file (or override) replaces the new-named key of an
    earlier one, and the reverse, as if both used one name; no conflict is reported."""
    tiny = REPO / "configs" / "tiny.yaml"  # rerank_k: 4
    assert load_config(tiny).retrieval.rerank_k == 4
    assert load_config(tiny, ["retrieval.k=2"]).retrieval.rerank_k == 2
    assert load_config(tiny, ["retrieval.k=2", "retrieval.rerank_k=3"]).retrieval.rerank_k == 3
    old_row = _write(tmp_path / "old-row.yaml", {"retrieval": OLD_RETRIEVAL})
    new_row = _write(tmp_path / "new-row.yaml", {"retrieval": NEW_RETRIEVAL})
    assert load_config([tiny, old_row]).retrieval == load_config([tiny, new_row]).retrieval
    assert load_config([old_row, tiny]).retrieval.rerank_k == 4  # tiny's rerank_k replaces the old row's k
    old_k = _write(tmp_path / "old-k.yaml", {"retrieval": {"k": 2}})
    assert load_config([new_row, old_k]).retrieval.rerank_k == 2  # and an old k replaces an earlier rerank_k


# --------------------------------------------------------------------------- finite numbers


def _float_keys() -> dict[str, str]:
    """``{dotted key: an override value that is not finite}`` for every float key of every section (a list or
    tuple of floats too), each model family's included."""
    sections = {f.name: getattr(Config(), f.name) for f in dataclasses.fields(Config)}
    sections |= {f"model.{name}": own for name, own in Config().model.families.items()}
    keys = {}
    for name, section in sections.items():
        if not dataclasses.is_dataclass(section):
            continue
        for f, hint in ((f, typing.get_type_hints(type(section))[f.name]) for f in dataclasses.fields(section)):
            args = typing.get_args(hint)
            if hint is float or (float in args and type(None) in args):
                keys[f"{name}.{f.name}"] = ".inf"
            elif args and all(a is float for a in args):  # list[float], tuple[float, float, float]
                n = len(args) if typing.get_origin(hint) is tuple else 3
                keys[f"{name}.{f.name}"] = "[" + ", ".join(["0.5"] * (n - 1) + [".nan"]) + "]"
    return keys


def test_every_float_key_of_every_section_refuses_a_value_that_is_not_finite():
    keys = _float_keys()
    assert {"pretrain.lr", "pretrain.eps", "qa.epochs", "fetch.timeout_s", "model.pixel_mean",
            "model.albef.momentum", "model.ts2net.frame_lambda", "synth.val_fraction"} <= set(keys)  # fmt: skip
    for key, value in keys.items():
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"{key}={value}"])
        message = str(info.value)
        assert message.startswith(key) and "expected a finite number, got " in message, message


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("pretrain.lr=.inf", "pretrain.lr: expected a finite number, got inf"),
        ("pretrain.lr=1.0e+309", "pretrain.lr: expected a finite number, got inf"),
        ("pretrain.lr=-.inf", "pretrain.lr: expected a finite number, got -inf"),
        ("pretrain.weight_decay=.inf", "pretrain.weight_decay: expected a finite number, got inf"),
        ("pretrain.grad_clip=.nan", "pretrain.grad_clip: expected a finite number, got nan"),
        ("pretrain.eps=.inf", "pretrain.eps: expected a finite number, got inf"),
        (f"pretrain.lr=1{'0' * 400}", "pretrain.lr: expected a finite number, got 10000"),  # an int past floats
        ("pretrain.betas=[0.9, .nan]", "pretrain.betas[1]: expected a finite number, got nan"),
    ],
)
def test_a_number_that_is_not_finite_is_an_error_naming_the_key(override, said):
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "tiny.yaml", [override])
    assert str(info.value).startswith(said)
    assert "this key takes no inf, nan or number past 1.8e308" in str(info.value)


def test_a_config_file_with_infinity_fails_at_load_and_from_the_cli_in_one_line(tmp_path):
    path = tmp_path / "inf.yaml"
    path.write_text("pretrain:\n  lr: .inf\nretrieval:\n  lr: 1.0e+309\n")
    with pytest.raises(ConfigError, match=r"^pretrain\.lr: expected a finite number, got inf"):
        load_config(path)
    code, err = _cli(tmp_path, ["--config", str(path)])
    assert code == 2 and err.startswith("vlp extract-frames: error: pretrain.lr: expected a finite number"), err
    code, err = _cli(tmp_path, ["pretrain.eps=.inf"])
    assert code == 2 and err.startswith("vlp extract-frames: error: pretrain.eps: expected a finite number"), err


def test_a_config_built_in_code_with_a_number_that_is_not_finite_fails_validation():
    from vlp.config import validate

    cfg = Config()
    cfg.pretrain.grad_clip = float("nan")
    cfg.pretrain.lr = float("inf")
    cfg.synth.val_fraction = float("-inf")
    cfg.model.families["albef"].momentum = float("nan")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    for fragment in (
        "pretrain.grad_clip=nan must be a finite number",
        "pretrain.lr=inf must be a finite number",
        "synth.val_fraction=-inf must be a finite number",
        "model.albef.momentum=nan must be a finite",
    ):
        assert fragment in message, message
    assert "pretrain.lr=inf must be >" not in message  # a key that is not finite is named once


@dataclass
class Timed:
    limit_s: float = field(default=float("inf"), metadata={NONFINITE: True})  # takes inf: marked beside the key
    wait_s: float = 1.0


def test_a_float_key_marked_nonfinite_takes_infinity_and_no_other_does():
    assert from_dict(Timed, {"limit_s": float("inf")}).limit_s == float("inf")
    assert nonfinite_values(Timed(), "timed") == {}
    assert nonfinite_values(Timed(wait_s=float("nan")), "timed").keys() == {"timed.wait_s"}
    with pytest.raises(ConfigError, match=r"^wait_s: expected a finite number, got inf"):
        from_dict(Timed, {"wait_s": float("inf")})


def test_an_integer_key_holds_a_64_bit_value():
    assert load_config(None, [f"pretrain.max_steps={2**63 - 1}"]).pretrain.max_steps == 2**63 - 1
    with pytest.raises(ConfigError, match=r"^pretrain\.max_steps: 9223372036854775808 is past the range of a 64-bit"):
        load_config(None, [f"pretrain.max_steps={2**63}"])
    with pytest.raises(ConfigError) as info:  # 20,000 bits: past what Python prints as decimal digits
        load_config(None, ["pretrain.max_steps=0x" + "f" * 5000])
    assert len(str(info.value)) < 200


# --------------------------------------------------------------------------- YAML read in bounded time and output


def _laughs(levels: int, under: str) -> str:
    """A "billion laughs" text: ``levels`` anchors, each a list of nine aliases of the one before, under ``under``
    (9^levels strings once written out)."""
    lines = [f"{under}", '    - &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"    - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _cli(tmp_path: Path, args: list[str]) -> tuple[int, str]:
    """``vlp extract-frames ... args`` as a process: its exit code and stderr."""
    script = Path(sys.executable).with_name("vlp")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "vlp.cli"]
    command += ["extract-frames", "--dataset", str(tmp_path / "d"), "--out", str(tmp_path / "o"), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert not (tmp_path / "o").exists()
    return done.returncode, done.stderr


@pytest.mark.parametrize("under", ["bogus:\n  deep:", "pretrain:\n  batch_size:"])
def test_a_billion_laughs_file_fails_at_once_in_one_short_line(tmp_path, under):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(9, under))
    assert path.stat().st_size < 800
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert time.perf_counter() - start < 0.5
    message = str(info.value)
    assert message.startswith(f"{path}: its YAML aliases (*name) add 1,") and "write the values out" in message
    assert len(message) < 300 and "\n" not in message
    start = time.perf_counter()
    code, err = _cli(tmp_path, ["--config", str(path)])
    assert time.perf_counter() - start < 60  # the process's start; the file itself: the half second above
    assert code == 2 and err == f"vlp extract-frames: error: {message}\n"


def test_aliases_that_add_little_load_and_a_recursive_or_deep_one_fails(tmp_path):
    shared = "pretrain:\n  lr: &lr 0.0002\n  betas: &betas [0.9, 0.99]\nqa:\n  lr: *lr\n  betas: *betas\n"
    cfg = load_config(_text(tmp_path, shared))
    assert (cfg.qa.lr, cfg.qa.betas) == (0.0002, [0.9, 0.99])
    merged = "pretrain: &p\n  lr: 0.0002\n  eps: 1.0e-6\nqa:\n  <<: *p\n  eps: 1.0e-7\n"  # a merge key
    assert (load_config(_text(tmp_path, merged)).qa.lr, load_config(_text(tmp_path, merged)).qa.eps) == (2e-4, 1e-7)
    with pytest.raises(ConfigError, match=r"an alias \(\*name\) lies inside its own anchor"):
        load_config(_text(tmp_path, "pretrain:\n  betas: &b [0.9, *b]\n"))
    many_merges = "a0: &a0 {k: 1}\n" + "".join(f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 9)}]}}\n"
                                                for i in range(1, 9))  # fmt: skip
    with pytest.raises(ConfigError, match="its YAML aliases"):
        load_config(_text(tmp_path, many_merges))


def _text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("pretrain:\n  betas: " + "[" * 5000 + "]" * 5000 + "\n", "mappings and lists nested more than 32 deep"),
        ("pretrain:\n  betas: [" + "0.1, " * 20000 + "0.1]\n", "more than 10,000 values, mappings and lists"),
        ("synth:\n  seed: 2001-02-30\n", "not valid YAML: day is out of range for month"),
        ("pretrain:\n  betas: !!python/object:os.system [x]\n", "not valid YAML: could not determine a constructor"),
    ],
)
def test_yaml_past_a_limit_or_not_yaml_fails_in_one_short_line(tmp_path, text, said):
    with pytest.raises(ConfigError) as info:
        load_config(_text(tmp_path, text))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'c.yaml'}: ") and said in message, message
    assert len(message) < 400 and "\n" not in message


def test_a_config_file_larger_than_the_limit_is_not_read(tmp_path):
    path = _text(tmp_path, "pretrain:\n  lr: 0.1\n" + "#" * (MAX_YAML_CHARS + 10) + "\n")
    with pytest.raises(ConfigError, match=r"larger than 262,144 bytes: a config holds settings, not data$"):
        load_config(path)
    with pytest.raises(ConfigError, match="more than the 262,144 a config may hold"):
        parse_override("pretrain.lr=" + "1" * (MAX_YAML_CHARS + 1))


def test_an_error_quotes_at_most_a_few_hundred_characters_of_a_value(tmp_path):
    long = "x" * 100_000
    cases = [
        ({"pretrain": {"batch_size": long}}, "pretrain.batch_size: expected an integer, got str 'xxx"),
        ({"pretrain": {long: 1}}, "unknown config key 'pretrain.xxx"),
        ({long: {}}, "unknown config key 'xxx"),
        ({"model": {long: 1}}, "unknown config key 'model.xxx"),
        ({"retrieval": {"score_rule": long}}, "retrieval.score_rule: 'xxx"),
        ({"model": {"family": long}}, "model.family='xxx"),
        ({"pretrain": {"betas": [[long]]}}, "pretrain.betas[0]: expected a number, got list ['xxx"),
    ]
    for data, said in cases:
        with pytest.raises(ConfigError) as info:
            load_config(_write(tmp_path / "long.yaml", data))
        message = str(info.value)
        quoted = message.partition("; valid keys: ")[0]  # the list of valid keys: bounded by the section
        assert said in quoted and "... (100,0" in quoted and len(quoted) < 400 and len(message) < 2000, message[:400]
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"frames.size={long}"])
    assert len(str(info.value)) < 400


def test_unknown_keys_are_found_before_values_and_keys_of_any_type_are_named():
    with pytest.raises(ConfigError, match=r"unknown config key 'inner\.sise'"):
        from_dict(Outer, {"inner": {"size": "big", "sise": 3}})  # the bad value comes first, the unknown key wins
    with pytest.raises(ConfigError, match=r"unknown config key 1 in section 'inner'"):
        from_dict(Outer, {"inner": {"size": 3, 1: 2, "b": 3}})  # keys that do not sort together


def test_every_other_reader_of_config_yaml_is_bounded_too(tmp_path):
    """The pipeline config, a run's ``config`` parameter (its credential check) and a submitted run parameter read
    YAML through the same loader."""
    from components._runtime import config_param_credentials
    from pipelines import config as pipeline_config
    from pipelines.submit import SubmitError, parse_params

    laughs = _laughs(9, "defaults:\n  deep:")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"its YAML aliases \(\*name\) add 1,") as info:
        pipeline_config.load(_text(tmp_path, laughs))
    assert len(str(info.value)) < 300
    assert config_param_credentials(laughs) == []
    package = REPO / "pipelines" / "compiled" / "retrieval.yaml"
    with pytest.raises(SubmitError, match=r"^parameter overrides: its YAML aliases"):
        parse_params(["overrides=" + _laughs(9, "x:")], package)
    assert time.perf_counter() - start < 2
