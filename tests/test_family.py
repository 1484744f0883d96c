"""The model-family interface: ALPRO through it, typed outputs, no tokenizer in forward, no family code in steps."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import torch

from vlp.models import family
from vlp.models.alpro.model import FAMILY, Alpro, AlproConfig, AlproOutput, alpro_losses, alpro_step
from vlp.models.family import Encoded, Kinds, PretrainBatch, StepContext, TextVocab
from vlp.models.tokenizer import train_wordpiece
from vlp.settings import ModelConfig, RetrievalConfig

REPO = Path(__file__).resolve().parents[1]
CAPTIONS = ["a red circle moves left", "a blue square bounces", "a green star drifts", "a yellow cube spins"]


@pytest.fixture(scope="module")
def tok():
    return train_wordpiece(CAPTIONS * 4, vocab_size=60)


def _batch(tok) -> PretrainBatch:
    enc = tok(CAPTIONS, padding="max_length", truncation=True, max_length=10, return_tensors="pt")
    video = torch.randn(4, 2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    return PretrainBatch(video, enc["input_ids"], enc["attention_mask"], video_index=torch.arange(4))


def test_the_mapping_names_every_family_and_each_meets_the_interface():
    known = family.families()
    assert tuple(known) == family.names() == ("albef", "alpro", "ts2net")  # every package with a spec module
    for name, fam in known.items():
        assert isinstance(fam, family.Family) and fam.name == name == family.spec(name).name
        assert isinstance(fam.kinds, Kinds) and len(set(fam.kinds.all())) == len(fam.kinds.all())
        assert family.get(name) is fam and all(family.of_kind(k) is fam for k in fam.kinds.all())
    with pytest.raises(ValueError, match=r"unknown model family 'clip4clip'; choose one of \['albef', 'alpro', 'ts2"):
        family.get("clip4clip")
    with pytest.raises(ValueError, match="unknown model kind 'clip_retrieval'"):
        family.of_kind("clip_retrieval")


def hooks_of(protocol: type) -> dict[str, typing.Any]:
    """The methods ``protocol`` itself declares (not those of the protocols it extends)."""
    return {name: f for name, f in vars(protocol).items() if inspect.isfunction(f) and not name.startswith("_")}


HOOKS = hooks_of(family.Family)
CAPABILITIES = {
    family.AnswersQuestions: hooks_of(family.AnswersQuestions),
    family.PairScorer: hooks_of(family.PairScorer),
}


def signature_problems(fam: object) -> list[str]:
    """Where ``fam`` departs from :class:`family.Family` and the optional capabilities it has: a data attribute of
    the wrong type, or a hook whose parameters (names, kinds, defaults; ``self`` aside) are not the protocol's.
    ``isinstance`` against a ``runtime_checkable`` protocol checks only that the names exist."""
    problems = []
    for attr, kind in typing.get_type_hints(family.Family).items():
        origin = typing.get_origin(kind) or kind
        if not isinstance(getattr(fam, attr, None), origin):
            problems.append(f"{attr}: {getattr(fam, attr, None)!r} is not a {kind}")
    hooks = dict(HOOKS)
    for capability, its_hooks in CAPABILITIES.items():
        if isinstance(fam, capability):
            hooks |= its_hooks
    for hook, proto in hooks.items():
        want = [(p.name, p.kind, p.default) for p in list(inspect.signature(proto).parameters.values())[1:]]
        method = getattr(fam, hook, None)
        got = [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()] if method else None
        if got != want:
            problems.append(f"{hook}{inspect.signature(method) if method else ' missing'} != protocol {want}")
    return problems


@pytest.mark.parametrize("name", family.names())
def test_every_hook_of_every_family_has_the_protocols_signature(name):
    assert {"train_step", "similarity", "config", "build"} <= set(HOOKS)
    assert set(CAPABILITIES[family.AnswersQuestions]) == {"set_answers", "qa_step", "qa_logits"}
    assert set(CAPABILITIES[family.PairScorer]) == {"reranks", "pair_logits"}
    assert signature_problems(family.get(name)) == []


def test_qa_and_re_ranking_are_capabilities_a_family_has_or_lacks_and_the_helpers_say_which(tok):
    """ALPRO and ALBEF answer questions and re-rank; TS2-Net does neither and defines none of those methods:
    :func:`family.qa_of` refuses it with a message that says what to run, :func:`family.pair_scorer_of` gives None."""
    has = {name: (isinstance(f, family.AnswersQuestions), isinstance(f, family.PairScorer))
           for name, f in family.families().items()}  # fmt: skip
    assert has == {"albef": (True, True), "alpro": (True, True), "ts2net": (False, False)}
    assert all(family.answers_questions(f) == bool(f.kinds.qa) for f in family.families().values())
    assert family.qa_of(FAMILY) is FAMILY
    with pytest.raises(ValueError, match=r"^model family ts2net has no QA model: .*\(albef, alpro\).*evaluate-retri"):
        family.qa_of(family.get("ts2net"))
    with_vtm = Alpro(AlproConfig.tiny(vocab_size=len(tok), losses=("vtc", "vtm")))
    assert family.pair_scorer_of(FAMILY, with_vtm) is FAMILY
    assert family.pair_scorer_of(FAMILY, Alpro(AlproConfig.tiny(vocab_size=len(tok), losses=("vtc",)))) is None
    assert family.pair_scorer_of(family.get("ts2net"), with_vtm) is None


def test_a_family_whose_qa_kind_and_methods_disagree_is_refused_as_broken():
    class NoQAMethods(type(family.get("ts2net"))):
        kinds = Kinds("x_pre", "x_ret", qa="x_qa")

    class QAMethodsWithoutKind(type(family.get("alpro"))):
        kinds = Kinds("y_pre", "y_ret", qa="")

    with pytest.raises(TypeError, match=r"kinds\.qa is 'x_qa' but it lacks \['set_answers', 'qa_step', 'qa_logits'\]"):
        family.qa_of(NoQAMethods())
    with pytest.raises(TypeError, match=r"kinds\.qa is '' but it has QA methods"):
        family.answers_questions(QAMethodsWithoutKind())


def test_a_family_with_the_right_names_but_wrong_signatures_is_caught():
    class Swapped(type(family.get("alpro"))):  # every name present, two hooks and one attribute wrong
        default_losses = "vtc"

        def train_step(self, model, ctx, batch):  # batch and ctx swapped
            return {}

        def config(self, model, vocab_size, num_entities):  # the default dropped
            return None

    wrong = Swapped()
    assert isinstance(wrong, family.Family)  # what the runtime check alone accepts
    problems = signature_problems(wrong)
    assert [p.split(":")[0].split("(")[0] for p in problems] == ["default_losses", "config", "train_step"], problems


def test_forward_takes_no_tokenizer_and_returns_typed_outputs_the_losses_read(tok):
    assert "tokenizer" not in inspect.signature(Alpro.forward).parameters
    cfg = AlproConfig.tiny(vocab_size=len(tok), losses=("vtc", "mlm", "vtm"))
    torch.manual_seed(0)
    model, batch = Alpro(cfg), _batch(tok)
    ctx = StepContext(vocab=TextVocab.of(tok), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)  # dropout draws from the global generator
    out = model(batch, ctx)
    assert isinstance(out, AlproOutput) and out.terms == ("vtc", "mlm", "vtm")
    assert out.vtm_logits.shape == (12, 2) and out.mlm_logits.shape == (4, 10, cfg.text.vocab_size)
    assert out.pem_logits is None and out.vtc_positives is None
    # the losses are a function of the outputs: the same numbers as the step the loop calls, on the same draws
    by_parts = alpro_losses(out, ctx)
    torch.manual_seed(1)
    whole = alpro_step(model, batch, dataclasses.replace(ctx, generator=torch.Generator().manual_seed(0)))
    values = {k: float(v.detach()) for k, v in by_parts.items()}
    assert values == {k: float(v.detach()) for k, v in whole.items()}
    assert values["loss"] == pytest.approx(sum(values[f"loss_{t}"] for t in out.terms))
    with pytest.raises(ValueError, match="no vocabulary"):
        model(batch, StepContext())


def test_text_vocab_is_what_mlm_reads_from_the_tokenizer(tok):
    vocab = TextVocab.of(tok)
    assert vocab.size == len(tok) and vocab.mask_token_id == tok.mask_token_id
    assert set(vocab.special_ids) == set(tok.all_special_ids)

    class NoMask:
        mask_token_id = None

    with pytest.raises(ValueError, match=r"no \[MASK\]"):
        TextVocab.of(NoMask())


def test_alpro_family_builds_configs_and_kinds(tok):
    cfg = FAMILY.config(ModelConfig(losses=["vtc", "vtm"], embed_dim=16), len(tok), 0)
    assert isinstance(cfg, AlproConfig) and cfg.losses == ("vtc", "vtm") and cfg.embed_dim == 16
    assert FAMILY.config_from_dict(dataclasses.asdict(cfg)) == cfg
    assert type(FAMILY.build("prompter", cfg)).__name__ == "DualEncoder"
    assert type(FAMILY.build("alpro_qa", cfg, 3)).__name__ == "AlproQA"
    with pytest.raises(ValueError, match="has no 'albef' model"):
        FAMILY.build("albef", cfg)  # another family's kind
    section = RetrievalConfig(losses=["contrastive"], matching_negatives="mixed", same_clip_matching="exclude")
    ret = FAMILY.task_config(dataclasses.replace(cfg, num_entities=4, losses=("vtc", "pem")), "retrieval", section)
    assert (ret.num_entities, ret.losses, ret.vtm_negatives, ret.same_video_vtm) == (0, ("vtc",), "mixed", "exclude")
    assert FAMILY.task_config(cfg, "qa", section).losses == ("vtc",)


def test_evaluation_methods_rank_with_the_similarity_and_rerank_with_vtm(tok):
    torch.manual_seed(0)
    model = Alpro(AlproConfig.tiny(vocab_size=len(tok), losses=("vtc", "vtm"))).eval()
    batch = _batch(tok)
    with torch.no_grad():
        videos = FAMILY.encode_video(model, batch.video)
        texts = FAMILY.encode_text(model, batch.input_ids, batch.attention_mask)
        sim = FAMILY.similarity(model, texts, videos)
        logits = FAMILY.pair_logits(model, texts.tokens, texts.mask, videos.tokens)
    assert isinstance(videos, Encoded) and videos.mask is None and texts.mask.shape == (4, 10)
    assert torch.allclose(sim, texts.feat @ videos.feat.t()) and sim.shape == (4, 4)
    assert torch.allclose(videos.feat.norm(dim=-1), torch.ones(4), atol=1e-5) and logits.shape == (4, 2)
    assert FAMILY.reranks(model)
    assert not FAMILY.reranks(Alpro(AlproConfig.tiny(vocab_size=len(tok), losses=("vtc",))))


def test_fine_tuning_and_evaluation_steps_hold_no_family_code():
    steps = Path(__file__).parents[1] / "src" / "vlp" / "steps"
    for name in ("finetune.py", "evaluate.py", "common.py"):
        modules = set()
        for node in ast.walk(ast.parse((steps / name).read_text())):
            if isinstance(node, ast.ImportFrom):
                modules.add(node.module or "")
                modules.update(f"{node.module}.{a.name}" for a in node.names)
        family_modules = {m for m in modules if m.startswith("vlp.models.") and m.split(".")[2] in family.names()}
        assert not family_modules, f"{name} imports {sorted(family_modules)}: go through vlp.models.family"


def test_each_family_reads_its_own_section_and_a_flat_key_still_loads_with_a_warning(caplog):
    from vlp.config import ConfigError, load_config, to_dict
    from vlp.models.albef.spec import AlbefSettings
    from vlp.models.alpro.spec import AlproSettings
    from vlp.models.ts2net.spec import TS2NetSettings

    cfg = load_config(None, ["model.albef.queue_size=8", "model.alpro.num_entities=5"])
    assert {n: type(s) for n, s in cfg.model.families.items()} == {
        "albef": AlbefSettings, "alpro": AlproSettings, "ts2net": TS2NetSettings,
    }  # fmt: skip
    assert cfg.model.own() is cfg.model.families["alpro"] and cfg.model.own().num_entities == 5
    assert cfg.model.families["albef"].queue_size == 8  # loaded and range-checked, read only when family=albef
    assert to_dict(cfg)["model"]["alpro"]["num_entities"] == 5 and "albef" not in to_dict(cfg)["model"]
    with caplog.at_level("WARNING", logger="vlp"):  # the layout before family sections
        old = load_config(None, ["model.family=albef", "model.queue_size=8", "model.vtm_negatives=mixed"])
    assert old.model.own().queue_size == 8 and old.model.families["alpro"].vtm_negatives == "mixed"
    assert "model.queue_size is now model.albef.queue_size" in caplog.text
    assert "model.vtm_negatives is now model.albef.vtm_negatives and model.alpro.vtm_negatives" in caplog.text
    with pytest.raises(ConfigError, match=r"unknown config key 'model.alpro.queue_size'"):
        load_config(None, ["model.alpro.queue_size=8"])  # ALBEF's key under ALPRO's section
    with pytest.raises(ConfigError, match=r"model.queue_size=8 and model.albef.queue_size=16 disagree"):
        load_config(None, ["model.queue_size=8", "model.albef.queue_size=16"])
    with pytest.raises(ConfigError, match=r"model.family='clip4clip' is not a registered family; choose one of"):
        load_config(None, ["model.family=clip4clip"])
    with pytest.raises(ConfigError, match=r"model.albef.momentum=2.0 must be in \[0, 1\]"):
        load_config(None, ["model.albef.momentum=2.0"])


def test_each_family_reads_the_shared_retrieval_words_in_its_own_terms(caplog):
    """``retrieval`` names objectives by what they do; each family's task_config maps them to its own config's
    terms (ALPRO: VTC / VTM, ALBEF: ITC / ITM), and TS2-Net, contrastive only, says it ignores matching."""
    section = RetrievalConfig(losses=["contrastive", "matching"], matching_negatives="mixed",
                              matching_hard_fraction=0.25, same_clip_contrastive="positive",
                              same_clip_matching="exclude")  # fmt: skip
    entities = {"alpro": 4}  # ALPRO's PEM needs a prompt bank; fine-tuning drops it
    configs = {name: fam.config(ModelConfig(family=name), 100, entities.get(name, 0))
               for name, fam in family.families().items()}  # fmt: skip
    alpro = family.get("alpro").task_config(configs["alpro"], "retrieval", section)
    assert (alpro.losses, alpro.vtm_negatives, alpro.vtm_hard_fraction) == (("vtc", "vtm"), "mixed", 0.25)
    assert (alpro.same_video_vtc, alpro.same_video_vtm) == ("positive", "exclude")
    albef = family.get("albef").task_config(configs["albef"], "retrieval", section)
    assert (albef.losses, albef.itm_negatives, albef.itm_hard_fraction) == (("itc", "itm"), "mixed", 0.25)
    assert albef.same_video == "positive"
    contrastive = dataclasses.replace(section, losses=["contrastive"])
    assert family.get("alpro").task_config(configs["alpro"], "retrieval", contrastive).losses == ("vtc",)
    assert family.get("albef").task_config(configs["albef"], "retrieval", contrastive).losses == ("itc",)
    ts2net = family.get("ts2net")
    with caplog.at_level("WARNING", logger="vlp"):
        ts2net.task_config(configs["ts2net"], "retrieval", contrastive)
    assert "ignored" not in caplog.text
    with caplog.at_level("WARNING", logger="vlp"):
        ts2net.task_config(configs["ts2net"], "retrieval", section)
    assert "retrieval.losses ['matching'] ignored: TS2-Net trains its contrastive loss only" in caplog.text


@pytest.mark.parametrize("name", family.names())
def test_every_lr_group_prefix_names_trainable_parameters_of_the_family(name):
    """A prefix that matches nothing makes fusion_lr_mult / backbone_lr_mult silently do nothing (ALBEF's fusion
    lives under ``online.``: the shared prefixes once missed it)."""
    from vlp.config import load_config

    fam = family.get(name)
    section = load_config(REPO / "configs" / "tiny.yaml", [f"model.family={name}"]).model
    config = fam.config(section, 300, 5 if "pem" in fam.default_losses else 0)
    kinds = [k for k in (fam.kinds.pretrained, fam.kinds.retrieval, fam.kinds.qa) if k]
    names = set()
    for kind in kinds:
        try:
            model = fam.build(kind, config, 3)
        except ValueError:  # a kind no step builds from this config (TS2-Net's zero-shot slot)
            continue
        names |= {n for n, p in model.named_parameters() if p.requires_grad}
    for prefix in (*fam.lr_groups.fusion, *fam.lr_groups.backbone):
        assert any(n.startswith(prefix) for n in names), f"{name}: {prefix!r} names no trainable parameter"


def test_the_registry_and_the_family_sections_load_without_torch():
    """The CLI's choices and every config load read the registry: that must not import torch (a data step, or
    `vlp --help`, would pay seconds for it)."""
    import subprocess
    import sys

    code = ("import sys; from vlp.config import load_config; from vlp.cli import build_parser; "
            "from vlp.models.family import specs; load_config(None, ['model.family=ts2net']); build_parser(); "
            "assert len(specs()) >= 3; print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_each_family_has_its_own_randaug_default_and_a_preset_name_reaches_any_family():
    """``randaug_ops: ""`` is the model's family's own op list (ALBEF: the paper's, without colour ops); a family
    that lists none (TS2-Net) takes the default family's; a named preset is the same list for every family, an
    unknown one is an error naming the known ones, in the config check as in the lookup."""
    from vlp.config import ConfigError, load_config

    presets = family.randaug_presets()
    assert family.randaug_ops("", "alpro") == presets["alpro"]
    assert family.randaug_ops("", "albef") == presets["albef_paper"] != presets["alpro"]
    assert family.randaug_ops("", "ts2net") == presets["alpro"]
    assert family.randaug_ops("albef_code", "alpro") == presets["albef_code"]
    with pytest.raises(ValueError, match=r"unknown RandAugment preset 'albef'; choose one of \['albef_code'"):
        family.randaug_ops("albef", "albef")
    with pytest.raises(ConfigError, match=r"retrieval.randaug_ops='flip' must be"):
        load_config(overrides=["retrieval.randaug_ops=flip"])


def test_a_family_cannot_take_another_familys_randaug_preset_name():
    taken = family.FamilySpec(name="copycat", title="Copycat", paper="-", settings=object, load="x:y",
                              pretrains=False, randaug=(("albef_code", ("Rotate",)),))  # fmt: skip
    with pytest.raises(ValueError, match=r"RandAugment presets \['albef_code'\] are another family's"):
        family.register(taken)
    assert "copycat" not in family.names()


def test_a_family_named_like_a_shared_model_key_is_refused_at_once():
    """``model.preset`` is a shared key, so a family called ``preset`` would make ``model.preset`` mean two things:
    registering it fails on the spot. The registry's list of shared keys is the ``model`` section's fields."""
    from dataclasses import fields

    from vlp import registry
    from vlp.settings import ModelConfig

    assert {f.name for f in fields(ModelConfig)} == registry.SHARED_MODEL_KEYS
    for name in ("preset", "families"):
        clash = family.FamilySpec(name=name, title="Clash", paper="-", settings=dict, load="x:y", pretrains=False)
        with pytest.raises(ValueError, match=rf"^a family cannot be called '{name}': model\.{name} is a shared key$"):
            family.register(clash)
        assert name not in family.names()


# --------------------------------------------------------------------------- sizes as data


def built_in_sizes() -> list[str]:
    return [name for name, one in family.specs().items() if one.sizes]


def test_the_built_in_families_declare_their_sizes_in_their_spec_tables():
    from vlp.models.alpro.spec import SIZES as ALPRO
    from vlp.models.ts2net.spec import SIZES as TS2NET

    assert built_in_sizes() == ["albef", "alpro", "ts2net"]
    assert family.spec("alpro").sizes is ALPRO and family.spec("ts2net").sizes is TS2NET
    assert list(ALPRO) == list(family.spec("albef").sizes) == ["tiny", "small", "small-pretrained", "paper"]
    assert list(TS2NET) == ["tiny", "small", "paper"]
    assert family.size("albef", "paper").weights == ("deit_base_patch16_224.fb_in1k", "bert-base-uncased")


@pytest.mark.parametrize("name", built_in_sizes())
def test_a_size_added_to_a_family_table_is_a_preset_that_builds_and_trains(name, tok, monkeypatch):
    """Adding a size is one table entry: a width-32 size beside ``tiny`` in the family's own table (no other file)
    loads from a config, gives towers of that width, and runs a retrieval training step to a finite loss whose
    backward reaches the towers."""
    from vlp.config import load_config

    tiny = family.size(name, "tiny")
    wide = dataclasses.replace(tiny, video={**tiny.video, "width": 32}, text={**tiny.text, "width": 32})
    monkeypatch.setitem(family.spec(name).sizes, "narrow", wide)
    overrides = [f"model.family={name}", "model.preset=narrow", "model.max_len=10", "model.num_frames=2"]
    section = load_config(None, overrides).model
    fam = family.get(name)
    cfg = fam.config(section, len(tok), 4 if "bank" in family.spec(name).pretrain_inputs else 0)
    assert (cfg.video.width, cfg.text.width) == (32, 32)
    cfg = fam.prepare(fam.task_config(cfg, "retrieval", RetrievalConfig(num_frames=2, max_len=10)), 1, 4)
    torch.manual_seed(0)
    model = fam.build(fam.kinds.retrieval, cfg)
    out = fam.train_step(model, _batch(tok), StepContext())
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    grads = [p.grad for n, p in model.named_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", built_in_sizes())
def test_a_preset_the_family_lacks_is_refused_at_config_load_naming_its_sizes(name):
    from vlp.config import ConfigError, load_config

    sizes = ", ".join(family.spec(name).sizes)
    with pytest.raises(ConfigError, match=rf"^model\.preset='huge' is not a size of {name}: {sizes}$"):
        load_config(None, [f"model.family={name}", "model.preset=huge"])
    section = ModelConfig(family=name)
    section.preset = "huge"  # set after the section's own check: the family's lookup refuses it as well
    with pytest.raises(ValueError, match=rf"^model\.preset='huge' is not a size of {name}: {sizes}$"):
        family.get(name).config(section, 60)


def test_the_cli_refuses_a_size_the_family_lacks_with_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "vlp.cli", "finetune-retrieval", "--model", "ts2net", "--dataset", str(tmp_path),
           "--frames", str(tmp_path), "--out", str(tmp_path / "out"), "model.preset=small-pretrained"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "vlp finetune-retrieval: error: model.preset='small-pretrained' is not a size of ts2net: tiny, small, paper"
    ]
    assert not (tmp_path / "out").exists()
