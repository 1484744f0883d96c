"""Text encoder, multimodal encoder, MLM head, BERT checkpoint split and the WordPiece tokenizer."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForMaskedLM

from vlp import storage
from vlp.models.text import (
    MLMHead,
    MultimodalEncoder,
    TextConfig,
    TextEncoder,
    build_text_model,
    load_bert_weights,
)
from vlp.models.tokenizer import (
    PretrainedUnavailableError,
    TextIds,
    load_text_ids,
    load_tokenizer,
    save_tokenizer,
    tokenizer_digest,
    train_wordpiece,
    upstream_of,
    wordpiece_vocab,
)

COLOURS = ["red", "green", "blue", "yellow", "purple"]
SHAPES = ["circle", "square", "triangle", "star", "hexagon"]
MOTIONS = ["moves left", "bounces", "spins slowly", "drifts upwards", "zigzags"]
SCENES = ["over a grass field", "on a brick wall", "across the sandy beach", "near a wooden fence"]


def _captions(n: int = 50) -> list[str]:
    combos = itertools.product(COLOURS, SHAPES, MOTIONS, SCENES)
    return [f"A {c} {s} {m} {p}." for c, s, m, p in itertools.islice(combos, 0, 7 * n, 7)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(_captions(), vocab_size=300)


@pytest.fixture(scope="module")
def hf_bert(tokenizer) -> BertForMaskedLM:
    """A random tiny 4-layer BERT with an MLM head, as transformers builds it (the reference)."""
    torch.manual_seed(0)
    cfg = TextConfig.tiny(vocab_size=len(tokenizer))
    model = BertForMaskedLM(cfg.to_bert_config()).eval()
    with torch.no_grad():  # non-trivial LayerNorms and biases so a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _batch(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


TEXTS = ["a red circle bounces", "the blue star drifts upwards over a grass field near a wooden fence"]


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_specials_and_round_trip(tokenizer) -> None:
    assert [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id] == [0, 1, 2]
    assert [tokenizer.sep_token_id, tokenizer.mask_token_id] == [3, 4]
    ids, mask = _batch(tokenizer, ["A Red CIRCLE bounces.", "a blue star"])
    assert ids[0, 0] == 2 and ids[0, int(mask[0].sum()) - 1] == 3  # [CLS] ... [SEP]
    assert ids[1, int(mask[1].sum()) :].eq(0).all() and mask[1, int(mask[1].sum()) :].eq(0).all()
    decoded = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert decoded == ["a red circle bounces.", "a blue star"]
    assert tokenizer("!")["input_ids"] == [2, 1, 3]  # a character never seen in the corpus is [UNK]
    assert tokenizer.convert_ids_to_tokens(tokenizer("grassy")["input_ids"])[1:-1] == [
        "grass",
        "##y",
    ]  # unseen word: subwords
    long = tokenizer(" ".join(["red"] * 100), truncation=True)["input_ids"]
    assert len(long) == 40 and long[-1] == 3  # model_max_length default 40


def test_wordpiece_vocab_merges_the_most_frequent_pair_and_breaks_ties_by_the_merged_token() -> None:
    vocab = wordpiece_vocab({"abc": 3, "abd": 3, "bd": 1}, vocab_size=100)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    alphabet = ["##b", "##c", "##d", "a", "b"]
    # (a, ##b) = 6 first; then (ab, ##c) = 3 and (ab, ##d) = 3 tie -> "abc" sorts first; then "abd"; (b, ##d) = 1
    assert list(vocab) == [*specials, *alphabet, "ab", "abc", "abd", "bd"]
    assert list(vocab.values()) == list(range(len(vocab)))
    assert list(wordpiece_vocab({"abc": 3, "abd": 3, "bd": 1}, vocab_size=12)) == [*specials, *alphabet, "ab", "abc"]
    assert "bd" not in wordpiece_vocab({"abc": 3, "abd": 3, "bd": 1}, vocab_size=100, min_frequency=2)


def test_training_the_tokenizer_twice_gives_the_same_vocabulary() -> None:
    """The tokenizers library's trainer gave 6 vocabularies in 6 trainings of one corpus (hash-order ties)."""
    captions = _captions(200)
    digests = {tokenizer_digest(train_wordpiece(captions, vocab_size=120)) for _ in range(4)}
    assert len(digests) == 1
    tok = train_wordpiece(list(reversed(captions)), vocab_size=120)  # corpus order does not matter either
    assert tokenizer_digest(tok) in digests
    assert tokenizer_digest(train_wordpiece(captions, vocab_size=119)) not in digests


def test_tokenizer_save_load_identical_ids(tokenizer, tmp_path: Path) -> None:
    save_tokenizer(tokenizer, str(tmp_path / "tok"))
    loaded = load_tokenizer(str(tmp_path / "tok"))
    texts = [*_captions(), "an unseen zebra jumps!", ""]
    assert loaded(texts)["input_ids"] == tokenizer(texts)["input_ids"]
    assert loaded.mask_token_id == 4 and loaded.model_max_length == 40


HARD = ["", " ", "A RED Circle!!", "Ünïcödé àccents façade", "日本語のテキスト", "emoji 🎉 party", "tab\tand\nnewline",
        "[CLS] [MASK] literal specials [SEP]", "x" * 300, " ".join(["the blue star drifts"] * 30), "a-b_c.d,e;f?g",
        "an unseen zebra jumps over quizzical words"]  # fmt: skip


@pytest.mark.parametrize("lowercase", [True, False])
@pytest.mark.parametrize("sides", [("right", "right"), ("left", "left")])
def test_inference_ids_are_transformers_without_transformers(tmp_path: Path, lowercase, sides) -> None:
    """:class:`TextIds` (a trained tokenizer through ``tokenizers`` alone) gives transformers' ids and mask for
    every text at every length, padded and truncated on either side; its size is transformers' too."""
    tok = train_wordpiece(_captions(), vocab_size=120 if lowercase else 200, lowercase=lowercase)
    save_tokenizer(tok, str(tmp_path / "first"))
    save_tokenizer(load_tokenizer(str(tmp_path / "first")), str(tmp_path / "tok"))  # as a step saves its input's
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    config["padding_side"], config["truncation_side"] = sides
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    theirs, mine = load_tokenizer(str(tmp_path / "tok")), load_text_ids(str(tmp_path / "tok"))
    assert isinstance(mine, TextIds) and len(mine) == len(theirs)
    texts = [*HARD, *_captions(20)]
    for length in (3, 5, 8, 24, 77):
        want = theirs(texts, padding="max_length", truncation=True, max_length=length, return_tensors="pt")
        got = mine(texts, padding="max_length", truncation=True, max_length=length, return_tensors="pt")
        assert set(got) == {"input_ids", "attention_mask"} <= set(want)
        for key in got:
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), (length, key)
    pad_side = 0 if sides[0] == "left" else -1
    assert got["attention_mask"][0, pad_side] == 0 and got["input_ids"][0, pad_side] == 0  # "" padded with [PAD]
    with pytest.raises(TypeError, match="padding='max_length'"):
        mine(texts, padding=True, max_length=8)


def test_inference_takes_transformers_for_a_tokenizer_with_rules_of_its_own(tokenizer, tmp_path: Path) -> None:
    """A class other than the plain wrapper (a hub tokenizer's ``BertTokenizer``, ``CLIPTokenizer``) or a key that
    may change the ids: transformers' tokenizer, as before."""
    save_tokenizer(tokenizer, str(tmp_path / "tok"))
    assert isinstance(load_text_ids(str(tmp_path / "tok")), TextIds)
    path = tmp_path / "tok" / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for change in ({"tokenizer_class": "BertTokenizer"}, {"do_lower_case": False}, {"add_bos_token": True},
                   {"pad_token": "[NOT-IN-THE-VOCABULARY]"}):  # fmt: skip
        path.write_text(json.dumps(config | change))
        assert not isinstance(load_text_ids(str(tmp_path / "tok")), TextIds), change
    path.write_text(json.dumps(config))
    spec = tmp_path / "tok" / "tokenizer.json"
    spec.write_text(json.dumps(json.loads(spec.read_text()) | {"post_processor": None}))  # no [CLS] ... [SEP] rule
    assert not isinstance(load_text_ids(str(tmp_path / "tok")), TextIds)
    with pytest.raises(FileNotFoundError):
        load_text_ids(str(tmp_path / "nothing-here"))


def test_a_tokenizer_smaller_than_its_vocab_txt_is_refused(tokenizer, tmp_path: Path) -> None:
    """transformers 5 was seen to build 5 tokens from a BERT vocab.txt: ids would then miss the embeddings."""
    save_tokenizer(tokenizer, str(tmp_path / "tok"))
    vocab = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    (tmp_path / "tok" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    assert len(load_tokenizer(str(tmp_path / "tok"))) == len(vocab)  # as many as listed: fine
    (tmp_path / "tok" / "vocab.txt").write_text("\n".join([*vocab, "zebra", "giraffe"]) + "\n")
    with pytest.raises(ValueError, match=rf"has {len(vocab)} tokens but its vocab.txt lists {len(vocab) + 2}"):
        load_tokenizer(str(tmp_path / "tok"))


def test_tokenizer_and_weights_through_s3(tokenizer, hf_bert, s3_bucket: str, tmp_path: Path) -> None:
    uri = f"{s3_bucket}/artifacts/tokenizer"
    save_tokenizer(tokenizer, uri)
    assert load_tokenizer(uri)(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]
    ids = load_text_ids(uri)
    assert isinstance(ids, TextIds)
    assert ids(TEXTS, max_length=12)["input_ids"].tolist() == tokenizer(TEXTS, padding="max_length", truncation=True,
                                                                        max_length=12)["input_ids"]  # fmt: skip
    hf_bert.save_pretrained(tmp_path / "bert")
    storage.upload(tmp_path / "bert" / "model.safetensors", f"{s3_bucket}/bert/model.safetensors")
    text, fusion, head = build_text_model(TextConfig.tiny(vocab_size=len(tokenizer), init=f"{s3_bucket}/bert"))
    digest = hashlib.sha256((tmp_path / "bert" / "model.safetensors").read_bytes()).hexdigest()
    want = {"source": f"{s3_bucket}/bert", "sha256": digest, "file": "model.safetensors"}
    assert upstream_of(f"{s3_bucket}/bert") == want  # the lineage of a model started from it
    assert torch.equal(head.bias, hf_bert.cls.predictions.bias)
    assert torch.equal(text.word_embeddings.weight, hf_bert.bert.embeddings.word_embeddings.weight)
    assert torch.equal(fusion.layers[1].output.dense.weight, hf_bert.bert.encoder.layer[3].output.dense.weight)


def test_unavailable_sources_raise_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError, match=r"offline mode.*train_wordpiece"):
        load_tokenizer("vlp-test/no-such-bert-uncased")
    text, fusion, _ = build_text_model(TextConfig.tiny())
    with pytest.raises(PretrainedUnavailableError, match=r"offline mode.*TextConfig\.init"):
        load_bert_weights(text, fusion, "vlp-test/no-such-bert-uncased")
    assert time.monotonic() - start < 10  # no network retries in offline mode
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no BERT weights"):
        load_bert_weights(text, fusion, str(tmp_path))


# --------------------------------------------------------------------------- checkpoint split


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_split_reproduces_full_bert_and_mlm_head(tokenizer, hf_bert, tmp_path: Path, attn: str) -> None:
    hf_bert.save_pretrained(tmp_path / "bert")  # model.safetensors with bert.* and cls.* keys
    cfg = TextConfig.tiny(vocab_size=len(tokenizer), init=str(tmp_path / "bert"), attn_implementation=attn)
    text, fusion, head = build_text_model(cfg)
    text.eval(), fusion.eval(), head.eval()
    ids, mask = _batch(tokenizer, TEXTS)
    with torch.no_grad():
        ref = hf_bert(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        t = text(ids, mask)
        f = fusion(t.tokens, t.attention_mask)  # text only: no video tokens
        logits = head(f.text)
    torch.testing.assert_close(t.tokens, ref.hidden_states[2], atol=1e-5, rtol=1e-5)  # after layer 2 of 4
    torch.testing.assert_close(f.tokens, ref.hidden_states[4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=1e-4)


def test_split_accepts_old_names_and_bin_and_checks_layers(tokenizer, hf_bert, tmp_path: Path) -> None:
    cfg = TextConfig.tiny(vocab_size=len(tokenizer))
    old = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v.clone()
        for k, v in hf_bert.state_dict().items()
    }
    torch.save(old, tmp_path / "old.bin")
    text, fusion, head = build_text_model(cfg)
    report = load_bert_weights(text, fusion, str(tmp_path / "old.bin"), mlm_head=head)
    assert "fusion.layers.1.output.LayerNorm.weight" in report.loaded and "mlm.bias" in report.loaded
    assert report.not_in_checkpoint == []
    torch.testing.assert_close(
        fusion.layers[0].attention.self.query.weight, hf_bert.bert.encoder.layer[2].attention.self.query.weight
    )

    three = TextConfig.tiny(vocab_size=len(tokenizer), text_layers=2, fusion_layers=1)
    with pytest.raises(ValueError, match=r"4 BERT layers.*3"):
        load_bert_weights(TextEncoder(three), MultimodalEncoder(three), dict(hf_bert.state_dict()))
    wrong_vocab = TextConfig.tiny(vocab_size=len(tokenizer) + 1)
    with pytest.raises(ValueError, match="vocabulary differs"):
        load_bert_weights(TextEncoder(wrong_vocab), MultimodalEncoder(wrong_vocab), dict(hf_bert.state_dict()))


# --------------------------------------------------------------------------- fusion behaviour


@pytest.fixture
def tiny_model(tokenizer):
    torch.manual_seed(1)
    cfg = TextConfig.tiny(vocab_size=len(tokenizer))
    text, fusion, head = build_text_model(cfg, video_width=48)
    return text.eval(), fusion.eval(), head.eval()


def test_shapes_and_views(tokenizer, tiny_model) -> None:
    text, fusion, head = tiny_model
    ids, mask = _batch(tokenizer, TEXTS)
    b, length = ids.shape
    video = torch.randn(b, 5, 48)  # (B, N, Cv), Cv != width -> projected
    t = text(ids, mask)
    f = fusion(t.tokens, t.attention_mask, video)
    assert t.tokens.shape == (b, length, 64) and t.cls.shape == (b, 64)
    assert f.tokens.shape == (b, length + 5, 64) and f.text_len == length
    assert f.text.shape == (b, length, 64) and f.video.shape == (b, 5, 64)
    assert f.text.data_ptr() == f.tokens.data_ptr()  # views, no copies
    assert torch.equal(f.attention_mask, torch.cat([mask, torch.ones(b, 5, dtype=mask.dtype)], 1))
    assert torch.equal(f.cls, f.tokens[:, 0])
    assert head(f.text).shape == (b, length, len(tokenizer))
    with pytest.raises(ValueError, match="video tokens must be"):
        fusion(t.tokens, t.attention_mask, video[:1])


def _reference_fusion(fusion: MultimodalEncoder, text_tokens, text_mask, video):
    """[text; video] through the fusion layers with a hand-built additive mask (eager attention)."""
    x = torch.cat([text_tokens, fusion.video_proj(video)], dim=1)  # (B, L + N, C)
    keep = torch.cat([text_mask, torch.ones(video.shape[:2], dtype=text_mask.dtype)], 1).bool()
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(x.dtype).min)[:, None, None, :]  # (B,1,1,S)
    for layer in fusion.layers:
        x = layer(x, additive)
    return x


def test_fusion_matches_reference_in_value_and_gradient(tokenizer, tiny_model) -> None:
    text, fusion, _ = tiny_model
    ids, mask = _batch(tokenizer, TEXTS)
    text_tokens = text(ids, mask).tokens.detach()
    video = torch.randn(ids.shape[0], 5, 48)
    t1, v1 = text_tokens.clone().requires_grad_(), video.clone().requires_grad_()
    t2, v2 = text_tokens.clone().requires_grad_(), video.clone().requires_grad_()
    out = fusion(t1, mask, v1).tokens
    ref = _reference_fusion(fusion, t2, mask, v2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(t1.grad, t2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v1.grad, v2.grad, atol=1e-5, rtol=1e-5)


def test_padding_is_ignored_and_video_interacts(tokenizer, tiny_model) -> None:
    text, fusion, _ = tiny_model
    ids, mask = _batch(tokenizer, TEXTS)
    real = mask.bool()
    video = torch.randn(ids.shape[0], 5, 48)
    with torch.no_grad():
        t = text(ids, mask)
        f = fusion(t.tokens, mask, video)
        # other ids in padded slots, plus three extra padded columns
        ids2 = torch.cat([ids.masked_fill(~real, 7), torch.full((ids.shape[0], 3), 9)], 1)
        mask2 = torch.cat([mask, torch.zeros(ids.shape[0], 3, dtype=mask.dtype)], 1)
        t2 = text(ids2, mask2)
        f2 = fusion(t2.tokens, mask2, video)
        f3 = fusion(t.tokens, mask, video + 1.0)
    assert (ids2 != ids2.masked_fill(~mask2.bool(), 0)).any()  # the padded ids really changed
    length = ids.shape[1]
    torch.testing.assert_close(t2.tokens[:, :length][real], t.tokens[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f2.text[:, :length][real], f.text[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f2.video, f.video, atol=1e-5, rtol=1e-5)  # video never sees text padding
    assert (f3.cls - f.cls).abs().max() > 1e-3  # the text [CLS] does attend to the video


@pytest.mark.parametrize("grad_checkpointing", [False, True])
def test_every_parameter_gets_a_gradient(tokenizer, grad_checkpointing: bool) -> None:
    torch.manual_seed(2)
    cfg = TextConfig.tiny(vocab_size=len(tokenizer), grad_checkpointing=grad_checkpointing, dropout=0.0)
    text, fusion, head = build_text_model(cfg, video_width=48)
    ids, mask = _batch(tokenizer, TEXTS)
    ids = ids.clone()
    ids[0, 1] = tokenizer.mask_token_id
    token_type = torch.zeros_like(ids)
    token_type[1, -1] = 1  # so the second segment embedding is used too
    t = text(ids, mask, token_type)
    f = fusion(t.tokens, mask, torch.randn(ids.shape[0], 5, 48))
    loss = torch.nn.functional.cross_entropy(head(f.text).flatten(0, 1), ids.flatten()) + f.video.square().mean()
    loss.backward()
    params = itertools.chain(
        text.named_parameters("text."), fusion.named_parameters("fusion."), head.named_parameters("mlm.")
    )
    missing = [n for n, p in params if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0]
    assert not missing, f"parameters without a (finite, non-zero) gradient: {missing}"
    assert torch.isfinite(loss)


def _counting(forward: Any, counts: list[int], i: int) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[i] += 1
        return forward(*args, **kwargs)

    return counted


def test_gradient_checkpointing_gives_same_gradients(tokenizer) -> None:
    """Same gradients with and without checkpointing, and checkpointing really happens: with it each layer's forward
    runs again during the backward pass (recomputing what was not kept), without it once."""
    grads, calls = [], []
    for gc in (False, True):
        torch.manual_seed(3)
        text, fusion, head = build_text_model(TextConfig.tiny(vocab_size=len(tokenizer), grad_checkpointing=gc))
        layers = [*text.layers, *fusion.layers]
        counted = [0] * len(layers)
        for i, layer in enumerate(layers):  # count calls of forward itself (transformers' layers skip module hooks)
            layer.forward = _counting(layer.forward, counted, i)
        ids, mask = _batch(tokenizer, TEXTS)
        torch.manual_seed(4)  # same dropout masks in both runs (checkpoint restores the RNG on recompute)
        t = text(ids, mask)
        f = fusion(t.tokens, t.attention_mask)
        forward_only = list(counted)
        head(f.text).logsumexp(-1).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in [*text.parameters(), *fusion.parameters()]]))
        calls.append((forward_only, list(counted)))
    torch.testing.assert_close(grads[0], grads[1])
    n = len(calls[0][0])
    assert calls[0] == ([1] * n, [1] * n)  # no checkpointing: one forward per layer, nothing recomputed
    assert calls[1] == ([1] * n, [2] * n)  # checkpointing: each layer recomputed once in the backward pass


# --------------------------------------------------------------------------- head, configs


def test_mlm_head_is_tied_and_saved_once(tokenizer, hf_bert, tmp_path: Path) -> None:
    text, fusion, head = build_text_model(TextConfig.tiny(vocab_size=len(tokenizer)))
    assert head.weight is text.word_embeddings.weight
    model = torch.nn.ModuleDict({"text": text, "fusion": fusion, "mlm": head})
    state = model.state_dict()
    assert not any(k.startswith("mlm.") and "word_embeddings" in k for k in state)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "m.safetensors")  # no shared tensors
    twin = copy.deepcopy(model)  # e.g. an EMA teacher keeps its own tie
    assert twin["mlm"].weight is twin["text"].word_embeddings.weight
    assert twin["mlm"].weight is not head.weight
    untied = MLMHead(TextConfig.tiny(vocab_size=len(tokenizer)))
    assert "decoder_weight" in dict(untied.named_parameters())
    report = load_bert_weights(text, fusion, dict(hf_bert.state_dict()), mlm_head=untied)
    assert torch.equal(untied.weight, hf_bert.cls.predictions.decoder.weight) and "mlm.decoder_weight" in report.loaded


def test_presets_and_validation() -> None:
    paper = TextConfig.paper()
    assert (paper.width, paper.text_layers, paper.fusion_layers, paper.heads) == (768, 6, 6, 12)
    assert paper.init == "bert-base-uncased" and paper.vocab_size == 30522
    with torch.device("meta"):  # sizes only, no 110M-parameter init on the CPU
        n = sum(p.numel() for m in (TextEncoder(paper), MultimodalEncoder(paper)) for p in m.parameters())
    # bert-base-uncased without pooler, by hand: embeddings 23,837,184 + 12 x 7,087,872 per layer
    assert n == 23_837_184 + 12 * 7_087_872 == 108_891_648
    tiny = TextConfig.tiny()
    assert (tiny.width, tiny.text_layers, tiny.fusion_layers) == (64, 2, 2)
    assert isinstance(tiny.to_bert_config(), BertConfig) and tiny.to_bert_config().num_hidden_layers == 4
    with pytest.raises(ValueError, match="not divisible"):
        TextConfig.tiny(heads=5)
    with pytest.raises(ValueError, match="max_positions"):
        TextConfig.tiny(max_len=100)
    with pytest.raises(ValueError, match="exceeds max_positions"):
        TextEncoder(tiny)(torch.ones(1, 65, dtype=torch.long))


# ------------------------------------------------------------------------------------ hub revisions and lineage


def _two_commit_bert_cache(monkeypatch, tmp_path, tokenizer, hf_bert) -> tuple[str, str, BertForMaskedLM]:
    """An offline hub cache holding ``vlp-test/tiny-bert`` at two commits: ``main`` (``hf_bert``) and ``v2`` (another
    BERT); returns (main's commit, v2's commit, v2's BERT)."""
    from hub_cache import add_snapshot, commit_sha, offline_hub

    cache = offline_hub(monkeypatch, tmp_path)
    torch.manual_seed(1)
    other = BertForMaskedLM(TextConfig.tiny(vocab_size=len(tokenizer)).to_bert_config()).eval()
    commits = commit_sha("tiny-bert v1"), commit_sha("tiny-bert v2")
    for bert, commit, refs in ((hf_bert, commits[0], ("main",)), (other, commits[1], ("v2",))):
        folder = tmp_path / commit
        bert.save_pretrained(folder)
        save_tokenizer(tokenizer, str(folder))
        add_snapshot(cache, "vlp-test/tiny-bert", folder, commit=commit, refs=refs)
    return commits[0], commits[1], other


def test_hub_bert_loads_the_revision_asked_for_and_records_its_commit(monkeypatch, tmp_path, tokenizer, hf_bert):
    main, v2, other = _two_commit_bert_cache(monkeypatch, tmp_path, tokenizer, hf_bert)
    for revision, want, commit in (("", hf_bert, main), ("v2", other, v2), (main, hf_bert, main)):
        cfg = TextConfig.tiny(vocab_size=len(tokenizer), init="vlp-test/tiny-bert", init_revision=revision)
        text, _, _ = build_text_model(cfg)
        assert torch.equal(text.word_embeddings.weight, want.bert.embeddings.word_embeddings.weight), revision
        record = upstream_of("vlp-test/tiny-bert", revision)
        assert record == {
            "source": "vlp-test/tiny-bert",
            "repo": "vlp-test/tiny-bert",
            "revision": revision or "main",
            "commit": commit,
            "file": "model.safetensors",
        }


def test_a_wrong_revision_is_a_clear_error_that_lists_what_is_cached(monkeypatch, tmp_path, tokenizer, hf_bert):
    main, _, _ = _two_commit_bert_cache(monkeypatch, tmp_path, tokenizer, hf_bert)
    cfg = TextConfig.tiny(vocab_size=len(tokenizer), init="vlp-test/tiny-bert", init_revision="v3")
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError, match=rf"revision 'v3' is not in the local cache .*main={main}"):
        build_text_model(cfg)
    with pytest.raises(PretrainedUnavailableError, match=r"revision '0{40}' is not in the local cache"):
        load_tokenizer("vlp-test/tiny-bert", revision="0" * 40)
    assert time.monotonic() - start < 10  # offline: no network retries
    with pytest.raises(ValueError, match="is a path, not a hub name"):
        load_bert_weights(*build_text_model(TextConfig.tiny())[:2], str(tmp_path / main), revision="v2")
    with pytest.raises(ValueError, match="init is empty"):
        TextConfig.tiny(init_revision="v2")


def test_a_hub_tokenizer_keeps_its_commit_through_save_and_load(monkeypatch, tmp_path, tokenizer, hf_bert):
    from vlp.models.tokenizer import UPSTREAM_FILE, tokenizer_upstream

    _, v2, _ = _two_commit_bert_cache(monkeypatch, tmp_path, tokenizer, hf_bert)
    tok = load_tokenizer("vlp-test/tiny-bert", revision="v2")
    want = {"source": "vlp-test/tiny-bert", "repo": "vlp-test/tiny-bert", "revision": "v2", "commit": v2}
    assert tokenizer_upstream(tok) == want and tok(TEXTS)["input_ids"] == tokenizer(TEXTS)["input_ids"]
    save_tokenizer(tok, str(tmp_path / "saved"))
    assert json.loads((tmp_path / "saved" / UPSTREAM_FILE).read_text()) == want
    assert tokenizer_upstream(load_tokenizer(str(tmp_path / "saved"))) == want
    assert tokenizer_upstream(tokenizer) is None  # trained on captions: nothing from outside
    save_tokenizer(tokenizer, str(tmp_path / "trained"))
    assert not (tmp_path / "trained" / UPSTREAM_FILE).exists()


def test_a_step_takes_its_tokenizer_at_the_text_weights_revision(monkeypatch, tmp_path, tokenizer, hf_bert):
    """model.text_init_revision pins the tokenizer too (the text weights' own); model.tokenizer_revision pins a
    named tokenizer; both come from the model section, as a user sets them."""
    from vlp.config import load_config
    from vlp.models.tokenizer import tokenizer_upstream
    from vlp.steps.common import step_tokenizer

    main, v2, _ = _two_commit_bert_cache(monkeypatch, tmp_path, tokenizer, hf_bert)
    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    cases = [
        (["model.text_init=vlp-test/tiny-bert", "model.text_init_revision=v2"], v2),
        (["model.text_init=vlp-test/tiny-bert"], main),
        (["model.tokenizer=vlp-test/tiny-bert", "model.tokenizer_revision=v2", "model.text_init_revision=xx"], v2),
    ]
    for i, (overrides, commit) in enumerate(cases):
        cfg = load_config(tiny, overrides)
        tok = step_tokenizer(cfg, str(tmp_path / "no-dataset"), str(tmp_path / f"out{i}"))
        assert tokenizer_upstream(tok)["commit"] == commit, overrides
        saved = json.loads((tmp_path / f"out{i}" / "tokenizer" / "upstream.json").read_text())
        assert saved["commit"] == commit
