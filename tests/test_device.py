"""Every tensor function computes on its inputs' device, never on torch's default device.

On a GPU the inputs live on ``cuda`` while torch's default device stays the CPU, so a tensor made without
``device=`` lands on the wrong device there. The CPU tests cannot see that with the default device left as it is;
here each function runs with another default device (``meta``, which holds no data) and must give, on the CPU,
exactly what it gives normally. The generator states a function draws from are CPU generators, as in training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from vlp.eval.retrieval import ranks_t2v, ranks_v2t, topk_rerank
from vlp.losses.entity import box_token_mask, crop_frames
from vlp.losses.matching import hard_negative_weights, sample_hard_negatives, vtm_labels, vtm_loss, vtm_pair_indices
from vlp.losses.mlm import mask_tokens
from vlp.train import checkpoint

FRAMES = torch.rand(2, 2, 3, 8, 8, generator=torch.Generator().manual_seed(0))  # (B, T, C, H, W)
BOXES = torch.tensor([[1, 2, 4, 4], [0, 0, 8, 8]])  # [top, left, height, width] in pixels
GRID_BOXES = torch.tensor([[0, 1, 2, 2], [0, 0, 4, 4]])  # on a 4x4 token grid
SIM = torch.rand(4, 4, generator=torch.Generator().manual_seed(1))
EXCLUDE = torch.tensor([[False, True, False, False]] * 4)
IDS = torch.randint(5, 50, (3, 12), generator=torch.Generator().manual_seed(2))
PAD = IDS[0, 0] == IDS
TEXT_VIDEO = torch.tensor([0, 1, 2, 0, 1, 2])
SCORES = torch.rand(6, 3, generator=torch.Generator().manual_seed(3))
NEG_TEXT, NEG_VIDEO = torch.tensor([1, 0, 3, 2]), torch.tensor([2, 3, 0, 1])
VTM_LOGITS = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])


def _masked(**kw: Any) -> Any:
    gen = torch.Generator().manual_seed(4)
    return mask_tokens(IDS, vocab_size=50, mask_token_id=4, prob=0.5, generator=gen, **kw)


def _rerank() -> Any:
    def scores(t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # a fixed scorer on the CPU
        return torch.stack([SIM[t, v], -SIM[t, v]], dim=1)

    return topk_rerank(SIM, 2, scores, batch_size=3).scores


# name -> a call whose inputs are made before the default device changes
CASES: dict[str, Callable[[], Any]] = {
    "crop_frames resize": lambda: crop_frames(FRAMES, BOXES, size=(4, 4)),
    "crop_frames zero_outside": lambda: crop_frames(FRAMES, BOXES, mode="zero_outside"),
    "box_token_mask": lambda: box_token_mask(GRID_BOXES, 4, 4),
    "hard_negative_weights": lambda: hard_negative_weights(SIM, EXCLUDE),
    "sample_hard_negatives": lambda: sample_hard_negatives(
        SIM, SIM.t(), exclude=EXCLUDE, generator=torch.Generator().manual_seed(5), hard_fraction=0.5
    ),
    "vtm_pair_indices": lambda: vtm_pair_indices(NEG_TEXT, NEG_VIDEO),
    "vtm_labels": lambda: vtm_labels(2, torch.device("cpu")),
    "vtm_loss": lambda: vtm_loss(VTM_LOGITS),
    "mask_tokens": lambda: _masked(special_ids=(IDS[0, 1].item(),)),
    "mask_tokens special_mask": lambda: _masked(special_mask=PAD, random_excludes_special=True),
    "mask_tokens special ids tensor": lambda: _masked(special_ids=IDS[0, :2], random_excludes_special=True),
    "ranks_t2v": lambda: ranks_t2v(SCORES, TEXT_VIDEO),
    "ranks_v2t": lambda: ranks_v2t(SCORES, TEXT_VIDEO),
    "topk_rerank": _rerank,
}


def _flat(out: Any) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_function_computes_on_its_inputs_device(name: str) -> None:
    want = _flat(CASES[name]())
    assert want, f"{name} returns no tensor: nothing to compare"
    with torch.device("meta"):
        got = _flat(CASES[name]())
    assert [t.device.type for t in got] == ["cpu"] * len(want)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.gpu
def test_ranks_on_a_gpu_take_the_video_indices_from_the_cpu() -> None:
    """Scores on the GPU with the text -> video indices on the CPU (as a dataset gives them): the ranks are the
    CPU's, computed on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    scores = SCORES.cuda()
    for rank in (ranks_t2v, ranks_v2t):
        got = rank(scores, TEXT_VIDEO)
        assert got.device.type == "cuda" and torch.equal(got.cpu(), rank(SCORES, TEXT_VIDEO))


def test_the_cuda_generator_is_captured_only_when_cuda_is_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """The current CUDA device's state is saved when CUDA is available *and* initialised (a CPU run never creates
    a CUDA context); faked here, as this machine has no GPU."""
    state = torch.arange(4, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: state)
    for available, initialised, saved in [(True, True, 1), (True, False, 0), (False, True, 0), (False, False, 0)]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda a=available: a)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda i=initialised: i)
        captured = checkpoint.capture_rng_state().torch_cuda
        assert len(captured) == saved and all(torch.equal(t, state) for t in captured)


@pytest.mark.gpu
def test_masks_and_boxes_on_the_cpu_meet_tensors_on_a_gpu() -> None:
    """A CPU mask or box list (as a loader gives them) used with GPU tensors: the result is the CPU result."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gpu = torch.device("cuda")
    crops = crop_frames(FRAMES.to(gpu), BOXES, size=(4, 4))
    assert torch.allclose(crops.cpu(), crop_frames(FRAMES, BOXES, size=(4, 4)))
    assert torch.allclose(hard_negative_weights(SIM.to(gpu), EXCLUDE).cpu(), hard_negative_weights(SIM, EXCLUDE))
    gen = torch.Generator(gpu).manual_seed(4)
    ids, labels = mask_tokens(IDS.to(gpu), vocab_size=50, mask_token_id=4, prob=0.5, generator=gen, special_mask=PAD)
    assert ids.device.type == "cuda" and bool((labels.cpu()[PAD] == -100).all())
