"""vlp's BERT layers (``vlp.models.layers.bert``) against transformers' (``modeling_bert``, ``masking_utils``), which
they replace: the same parameters from the same seed, the same bits forward and backward on both attention paths,
with and without padding and dropout, and the same masks; and building ALPRO's or ALBEF's models imports none of
transformers' model code."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import BertConfig
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.models.bert import modeling_bert as hf

from vlp.models.layers import bert
from vlp.models.text import TextConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module

ATTN = ("sdpa", "eager")


def sizes(attn: str) -> tuple[BertConfig, bert.BertDims]:
    cfg = TextConfig.tiny(vocab_size=97, attn_implementation=attn, dropout=0.25, layer_norm_eps=1e-6)
    return cfg.to_bert_config(), cfg.dims()


def built(make_theirs, make_mine) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(7)
    theirs = make_theirs()
    torch.manual_seed(7)
    mine = make_mine()
    return theirs, mine


def assert_same_parameters(theirs: torch.nn.Module, mine: torch.nn.Module) -> None:
    a, b = theirs.state_dict(), mine.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def padded(batch: int = 3, length: int = 9) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    return mask


def run_both(theirs, mine, call_theirs, call_mine, inputs: list[torch.Tensor], train: bool):
    """Forward and backward of each module from the same seed: outputs and every gradient, theirs then mine."""
    got = []
    for module, call in ((theirs, call_theirs), (mine, call_mine)):
        module.train(train)
        module.zero_grad()
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        torch.manual_seed(11)
        out = call(module, *xs)
        out.pow(2).sum().backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters()}
        got.append((out.detach(), grads, [x.grad for x in xs if x.is_floating_point()]))
    return got


def assert_same_run(got) -> None:
    (out_a, grads_a, in_a), (out_b, grads_b, in_b) = got
    assert torch.equal(out_a, out_b)
    assert list(grads_a) == list(grads_b)
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name
    for a, b in zip(in_a, in_b, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("pad", [False, True], ids=["full", "padded"])
def test_a_layer_equals_transformers_bert_layer_bit_for_bit(attn, train, pad):
    config, dims = sizes(attn)
    theirs, mine = built(lambda: hf.BertLayer(config, layer_idx=0), lambda: bert.BertLayer(dims))
    assert_same_parameters(theirs, mine)
    mask = padded() if pad else torch.ones(3, 9, dtype=torch.long)
    x = torch.randn(3, 9, dims.width)
    their_mask = create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=mask)
    my_mask = bert.padding_mask(mask, 9, attn, x.dtype)
    got = run_both(theirs, mine, lambda m, x: m(x, their_mask), lambda m, x: m(x, my_mask), [x], train)
    assert_same_run(got)
    if train:  # dropout drew masks: the outputs differ from an eval pass
        mine.eval()
        assert not torch.equal(got[1][0], mine(x, my_mask).detach())


@pytest.mark.parametrize("attn", ATTN)
def test_cross_attention_equals_transformers_bit_for_bit(attn):
    config, dims = sizes(attn)
    theirs, mine = built(lambda: hf.BertAttention(config, layer_idx=0, is_cross_attention=True),
                         lambda: bert.BertAttention(dims))  # fmt: skip
    assert_same_parameters(theirs, mine)
    x, states, states_mask = torch.randn(3, 5, dims.width), torch.randn(3, 9, dims.width), padded()
    their_mask = create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=states_mask,
                                           encoder_hidden_states=states)  # fmt: skip
    my_mask = bert.padding_mask(states_mask, 5, attn, states.dtype)
    got = run_both(theirs, mine, lambda m, x, s: m(x, None, s, their_mask)[0], lambda m, x, s: m(x, my_mask, s),
                   [x, states], train=True)  # fmt: skip
    assert_same_run(got)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_embeddings_and_the_mlm_transform_equal_transformers(train):
    config, dims = sizes("sdpa")
    theirs, mine = built(lambda: hf.BertEmbeddings(config), lambda: bert.BertEmbeddings(dims))
    assert_same_parameters(theirs, mine)
    ids = torch.randint(0, dims.vocab_size, (3, 9))
    types = torch.randint(0, 2, (3, 9))
    for segments in (None, types):
        got = run_both(theirs, mine, lambda m, i, s=segments: m(input_ids=i, token_type_ids=s),
                       lambda m, i, s=segments: m(i, s), [ids], train)  # fmt: skip
        assert_same_run(got)
    theirs, mine = built(lambda: hf.BertPredictionHeadTransform(config), lambda: bert.BertPredictionHeadTransform(dims))
    assert_same_parameters(theirs, mine)
    x = torch.randn(3, 9, dims.width)
    assert_same_run(run_both(theirs, mine, lambda m, x: m(x), lambda m, x: m(x), [x], train))


@pytest.mark.parametrize("attn", ATTN)
def test_masks_equal_transformers(attn):
    config, _ = sizes(attn)
    for mask in (padded(), torch.ones(3, 9, dtype=torch.long), padded().float()):
        for queries in (9, 4):
            x = torch.zeros(3, queries, 8)
            states = torch.zeros(3, 9, 8)
            theirs = create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=mask,
                                               encoder_hidden_states=states if queries != 9 else None)  # fmt: skip
            mine = bert.padding_mask(mask, queries, attn, x.dtype)
            assert (theirs is None) == (mine is None) == bool(mask.all())
            if mine is not None:
                assert mine.dtype == theirs.dtype and mine.shape == theirs.shape == (3, 1, queries, 9)
                assert torch.equal(mine, theirs)
        x = torch.zeros(3, 9, 8)
        theirs = create_causal_mask(config=config, inputs_embeds=x, attention_mask=mask, cache=None,
                                    allow_is_causal_skip=False)  # fmt: skip
        mine = bert.causal_mask(mask, attn, x.dtype)
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    # what the masks say, independently of transformers: row 1 of padded() is real up to position 5
    allowed = bert.causal_mask(padded(), "sdpa", torch.float32)[1, 0]
    assert allowed[7].tolist() == [True] * 5 + [False] * 4 and allowed[2].tolist() == [True] * 3 + [False] * 6
    blocked = bert.padding_mask(padded(), 4, "eager", torch.float32)[2, 0]
    assert blocked[:, :2].eq(0).all() and blocked[:, 2:].eq(torch.finfo(torch.float32).min).all()


BUILD = """
import sys
from vlp.models import family
from vlp.settings import ModelConfig, RetrievalConfig
fam = family.get({name!r})
section = ModelConfig(family={name!r}, preset="tiny", img_size=32, num_frames=2, max_len=24, embed_dim=16)
cfg = fam.config(section, 300, 4 if "bank" in family.spec({name!r}).pretrain_inputs else 0)
fam.build(fam.kinds.pretrained, cfg)
cfg = fam.prepare(fam.task_config(cfg, "retrieval", RetrievalConfig(num_frames=2, max_len=24)), 2, 4)
net = fam.build(fam.kinds.retrieval, cfg)
print(sum(p.numel() for p in net.parameters()) > 0, [m for m in {heavy!r} if m in sys.modules])
"""


@pytest.mark.parametrize("name", ["alpro", "albef"])
def test_building_alpro_or_albef_imports_no_model_code_of_transformers(name):
    """transformers' BERT modules (``modeling_bert``, ``masking_utils``) and what they pull (``torch._dynamo``) cost
    about 2 s of every step's start-up; a family built from vlp's layers imports none of them."""
    heavy = ("transformers.modeling_utils", "transformers.masking_utils", "transformers.models.bert.modeling_bert",
             "torch._dynamo")  # fmt: skip
    code = BUILD.format(name=name, heavy=heavy)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []"
