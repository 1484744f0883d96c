"""The ALPRO prompt bank: templates, template-major layout, ensembling, save/load."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

from vlp.models.alpro.prompts import (
    IMAGE_TEMPLATES,
    VIDEO_TEMPLATES,
    PromptBank,
    build_prompt_bank,
    build_prompts,
    ensemble,
)


def test_the_twelve_alpro_templates():
    assert len(VIDEO_TEMPLATES) == len(IMAGE_TEMPLATES) == 12
    assert VIDEO_TEMPLATES[0] == "A footage of a {}." and VIDEO_TEMPLATES[-1] == "A video footage of one {}."
    assert "A good picture of the {}." in IMAGE_TEMPLATES and len(set(VIDEO_TEMPLATES)) == 12


def test_prompts_are_template_major():
    prompts = build_prompts(["dog", "cat"], VIDEO_TEMPLATES[:2])
    assert prompts == ["A footage of a dog.", "A footage of a cat.", "A footage of the dog.", "A footage of the cat."]
    with pytest.raises(ValueError, match="needs at least one entity"):
        build_prompts([])


def test_ensemble_is_the_mean_of_normalised_rows_and_renormalises_on_request():
    rows = torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, 5.0], [0.0, 1.0]])  # T=2 templates x M=2 entities
    mean = ensemble(rows, 2)
    # entity 0: mean of [1, 0] and [0, 1]; entity 1: mean of [0, 1] and [0, 1]
    assert torch.allclose(mean, torch.tensor([[0.5, 0.5], [0.0, 1.0]]))
    assert torch.allclose(ensemble(rows, 2, renormalize=True), F.normalize(torch.tensor([[0.5, 0.5], [0.0, 1.0]])))
    with pytest.raises(ValueError, match=r"expected \(3 \* M, D\) embeddings"):
        ensemble(rows, 3)


def test_build_save_load_roundtrip(tmp_path):
    calls = []

    def encode(prompts):  # a deterministic fake text tower: 2 features from the prompt text
        calls.append(len(prompts))
        return torch.tensor([[float(len(p)), float(p.count("a"))] for p in prompts])

    bank = build_prompt_bank(encode, ["circle", "star", "grass"], batch_size=10)
    assert bank.video.shape == bank.image.shape == (3, 2)
    assert sum(calls) == 2 * 12 * 3 and max(calls) <= 10
    expected = ensemble(encode(build_prompts(["circle", "star", "grass"])), 12)
    assert torch.allclose(bank.video, expected)
    bank.save(str(tmp_path / "bank"))
    back = PromptBank.load(str(tmp_path / "bank"))
    assert back.entities == ["circle", "star", "grass"] and not back.renormalize
    assert torch.equal(back.video, bank.video) and torch.equal(back.image, bank.image)


def test_without_ensembling_one_template_per_branch_is_embedded():
    seen: list[str] = []

    def encode(prompts: list[str]) -> torch.Tensor:  # a fixed random vector per prompt text, any batch order
        seen.extend(prompts)
        return torch.stack(
            [torch.randn(8, generator=torch.Generator().manual_seed(zlib.crc32(p.encode()))) for p in prompts]
        )

    bank = build_prompt_bank(encode, ["circle", "sky"], ensemble_templates=False)
    video, image = ["A video of a circle.", "A video of a sky."], ["A photo of a circle.", "A photo of a sky."]
    assert seen == video + image
    # each row is its entity's one prompt, normalised: not another template's, not the other branch's
    assert torch.allclose(bank.video, F.normalize(encode(video), dim=-1))
    assert torch.allclose(bank.image, F.normalize(encode(image), dim=-1))
    ensembled = build_prompt_bank(encode, ["circle", "sky"])
    assert not torch.allclose(ensembled.video, bank.video, atol=0.1)  # 12 templates' mean is another vector
