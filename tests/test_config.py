from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from vlp.config import Config, ConfigError, from_dict, load_config, parse_override

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


def test_cli_reports_a_broken_config_file_in_one_line(tmp_path, capsys):
    from vlp.cli import main

    broken = tmp_path / "broken.yaml"
    broken.write_text("frames: [1, 2\n")
    args = ["extract-frames", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), "--config", str(broken)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and len(err.strip().splitlines()) == 1


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
        from vlp.models.albef import FAMILY

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
        from vlp.models.ts2net import FAMILY as TS2NET

        layered = [
            REPO / "configs" / "default.yaml",
            REPO / "configs" / "ts2net" / "msrvtt.yaml",
            REPO / "configs" / name,
        ]
        ts2 = TS2NET.task_config(TS2NET.config(load_config(layered).model, 49408), "retrieval", cfg.retrieval)
        assert ts2.video.init == "openai/clip-vit-base-patch32" and ts2.aggregator_layers == 4
