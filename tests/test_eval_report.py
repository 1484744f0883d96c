"""Report files: they exist, carry the metric values, the HTML parses and every image decodes."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlp.eval.qa import qa_metrics
from vlp.eval.retrieval import ranks_t2v, retrieval_metrics
from vlp.models.alpro.figure import pem_figure
from vlp.report import qa_report, rank_histogram, retrieval_report


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Collect:
    parser = _Collect()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def _decode(src: str) -> Image.Image:
    match = re.fullmatch(r"data:image/(png|jpeg);base64,(.+)", src)
    assert match, f"image is not an inline data URI: {src[:60]}"
    img = Image.open(io.BytesIO(base64.b64decode(match.group(2))))
    img.load()
    return img


def _jpeg(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="JPEG")
    return buf.getvalue()


def test_rank_histogram_bins() -> None:
    _, counts = rank_histogram(torch.tensor([1, 1, 2, 3, 5, 6, 10, 11, 20, 21, 50, 51, 100, 101, 5000]))
    assert counts == [("1", 2), ("2", 1), ("3-5", 2), ("6-10", 2), ("11-20", 2), ("21-50", 2), ("51-100", 2),
                      (">100", 2)]  # fmt: skip


def test_retrieval_report_files(tmp_path: Path) -> None:
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.4, 0.4, 0.2], [0.7, 0.8, 0.3]])
    text_video = torch.tensor([0, 1, 2])
    metrics = retrieval_metrics(scores, text_video) | {"num_pairs": 9}
    metrics |= {f"vtc_{k}": v + 1 for k, v in retrieval_metrics(scores, text_video).items()}
    examples = [
        {"query": "a red <circle> moves left", "correct_video": "v0",
         "top5": [("v0", 0.9, _jpeg((200, 0, 0))), ("v2", 0.5, _jpeg((0, 200, 0))), ("v1", 0.1, None)]},
        {"query": "a blue square", "correct_video": "v9", "top5": [("v1", 0.4, _jpeg((0, 0, 200)))]},
    ]  # fmt: skip
    paths = retrieval_report(metrics, ranks_t2v(scores, text_video), examples, tmp_path / "out")
    assert all(Path(p).is_file() for p in paths)
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    html_path = tmp_path / "out" / "report.html"
    assert str(html_path) in paths
    for key in ("t2v_r1", "t2v_medr", "t2v_meanr", "v2t_r5", "rsum"):
        value = f"{metrics[key]:.2f}"
        assert value in md, f"{key} = {value} missing from report.md"
    assert "num_pairs" in md and "| 9 |" in md
    assert f"| vtc text → video | {metrics['vtc_t2v_r1']:.2f} |" in md  # no pairs_scored: shown
    assert "| text → video | 33.33 | 100.00 | 100.00 | 2.00 | 2.00 |" in md  # t2v ranks [1, 2, 3]
    assert "✓" in md and "not in the top 5" in md
    assert "![rank histogram](rank_histogram.png)" in md
    assert all((tmp_path / "out" / rel).is_file() for rel in re.findall(r"\]\(([^)]+\.png)\)", md))

    page = _parse(html_path)
    assert {"html", "table", "img", "figure"} <= set(page.tags)
    text = "".join(page.text)
    assert f"{metrics['t2v_r1']:.2f}" in text and f"{metrics['rsum']:.2f}" in text
    assert "a red <circle> moves left" in text  # escaped in the HTML, intact once parsed
    assert len(page.images) == 1 + 4  # histogram + 4 thumbnails, all inline
    sizes = [_decode(src).size for src in page.images]
    assert sizes[0] == Image.open(tmp_path / "out" / "rank_histogram.png").size
    assert html_path.read_text(encoding="utf-8").count('class="ok"') == 1  # only v0 in example 1 is correct


def test_reports_refuse_uris(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="local directory"):
        qa_report({"accuracy": 1.0}, "s3://bucket/report")


def test_qa_report_files(tmp_path: Path) -> None:
    metrics = qa_metrics(
        ["red", "circle", "two", "red"], ["red", "blue", "two", "purple"], ["color", "color", "count", "color"],
        vocab=["red", "blue", "circle", "two"],
    )  # fmt: skip
    paths = qa_report(metrics, tmp_path)
    assert [Path(p).name for p in paths] == ["report.md", "report.html"]
    md = Path(paths[0]).read_text(encoding="utf-8")
    # accuracy 2/4 = 50.00 %, color 1/3 = 33.33 %, count 100.00 %, OOV 25.00 %
    for value in ("50.00", "33.33", "100.00", "25.00"):
        assert value in md
    assert "| color | 1 | 0 | 1 | 1 |" in md  # confusion row: columns color, count, then oov, unseen
    page = _parse(Path(paths[1]))
    assert page.tags.count("table") == 4  # the verdict, then overall, per type, confusion
    text = "".join(page.text)
    assert "33.33" in text and "oov" in text


@pytest.mark.parametrize("as_array", [True, False])
def test_pem_figure_png(tmp_path: Path, as_array: bool) -> None:
    frames = np.zeros((4, 60, 80, 3), dtype=np.uint8)
    frames[..., 1] = 90
    given = frames if as_array else [Image.fromarray(f) for f in frames]
    top5 = [("circle", 0.61), ("square", 0.2), ("grass", 0.1), ("sky", 0.05), ("road", 0.04)]
    path = pem_figure(given, (20, 15, 60, 45), top5, tmp_path / "fig" / "pem.png")
    img = Image.open(path)
    img.load()
    assert img.format == "PNG"
    scale = 128 / 60
    assert img.width >= 4 * round(80 * scale)  # frames side by side
    assert img.height > 128 + 5 * 20  # bars underneath
    # the crop outline is drawn in red on the first frame at the scaled box corner
    rgb = img.convert("RGB")
    edge_x, mid_y = 4 + round(20 * scale), 4 + round(30 * scale)
    window = [rgb.getpixel((x, mid_y)) for x in range(edge_x - 2, edge_x + 3)]
    assert any(r > 200 and g < 80 and b < 80 for r, g, b in window), window
    assert rgb.getpixel((edge_x + 10, mid_y)) == (0, 90, 0)  # inside the box: the frame itself


def test_pem_figure_rejects_a_box_outside_the_frame(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="box"):
        pem_figure(np.zeros((2, 10, 10, 3), np.uint8), (0, 0, 11, 5), [("a", 1.0)], tmp_path / "x.png")


def test_headline_table_puts_each_figure_next_to_what_it_must_beat() -> None:
    from vlp.report import headline_table

    retrieval = {"t2v_r1": 12.0, "vtc_t2v_r1": 10.0, "chance_t2v_r1": 1.0, "v2t_r1": 8.0, "chance_v2t_r1": 1.0,
                 "vtm_loss": 0.5, "vtm_loss_prior": 0.6365}  # fmt: skip
    qa = {"accuracy": 0.42, "majority_accuracy": 0.2, "chance_accuracy": 0.01}
    table = headline_table({"retrieval": retrieval, "qa": qa})
    assert "| retrieval | text → video R@1 | 12.00 | 10.00 | 1.00 |  |" in table
    assert "| retrieval | video → text R@1 | 8.00 |  | 1.00 |  |" in table  # a missing level stays blank
    assert "| qa | accuracy (%) | 42.00 |  | 1.00 | 20.00 |" in table
    assert "| retrieval | held-out VTM loss (lower is better) | 0.50 |  | 0.64 (label prior) |  |" in table
    assert "VTM loss" not in headline_table({"qa": qa})


# --------------------------------------------------------------------------- verdicts next to the figures


@pytest.mark.parametrize(
    ("value", "chance", "tolerance", "expected"),
    [
        (16.67, 16.67, 0.0, "at chance"),  # exactly at chance, no count of queries
        (100 / 6, 100 * (1 / 6), 0.0, "at chance"),  # equal up to float rounding
        (20.0, 16.67, 100 / 12, "at chance"),  # less than one query's worth above
        (10.0, 16.67, 100 / 12, "at chance"),  # less than one query's worth below
        (100 / 12, 100 / 6, 100 / 12, "below chance"),  # exactly one query's worth below is below
        (8.3, 16.7, 0.0, "below chance"),
        (62.5, 10.0, 1.0, "above chance by 6.25x"),
        (5.0, 0.0, 0.0, "above chance (chance is 0)"),
        (42.0, None, 1.0, "no baseline recorded"),
        (float("nan"), 16.67, 1.0, "no verdict: the figure is NaN"),  # not "below chance"
    ],
)
def test_verdict_against_chance(value, chance, tolerance, expected) -> None:
    from vlp.report import verdict

    assert verdict(value, chance, tolerance) == expected


@pytest.mark.parametrize(
    ("value", "chance", "majority", "expected"),
    [
        (42.0, 1.0, 20.0, "above the majority baseline by 22.00 points"),
        (20.1, 1.0, 20.0, "equal to the majority baseline"),  # within one question (0.2 points)
        (20.0, 1.0, 20.0, "equal to the majority baseline"),
        (15.0, 1.0, 20.0, "below the majority baseline"),  # above chance, but a constant answer does better
        (0.2, 1.0, 20.0, "below chance"),  # below chance is said first, whatever the majority says
        (0.4, 1.0, 0.0, "below chance"),  # above a majority guess the vocabulary lacks, still below chance
        (30.0, 1.0, None, "above chance by 30.00x"),  # no majority baseline: against chance alone
        (30.0, None, 20.0, "above the majority baseline by 10.00 points"),  # no chance level
        (30.0, None, None, "no baseline recorded"),
    ],
)
def test_verdict_against_the_majority_baseline(value, chance, majority, expected) -> None:
    from vlp.report import verdict

    assert verdict(value, chance, 0.2, majority=majority) == expected


def test_verdict_for_a_figure_where_lower_is_better() -> None:
    from vlp.report import verdict

    assert verdict(5.0, 50.5, 1.0, lower_is_better=True) == "better than chance by 10.10x"  # a median rank
    assert verdict(50.0, 50.5, 1.0, lower_is_better=True) == "at chance"
    assert verdict(60.0, 50.5, 1.0, lower_is_better=True) == "worse than chance"
    assert verdict(0.7, 0.6365, lower_is_better=True, level="the label prior") == "worse than the label prior"


def _below_chance_ranking() -> tuple[torch.Tensor, torch.Tensor]:
    """12 captions of 6 clips, only caption 0 ranks its clip first: ``(scores (12, 6), text_video (12,))``."""
    text_video = torch.arange(6).repeat_interleave(2)  # (12,)
    scores = torch.zeros(12, 6)
    scores[torch.arange(12), (text_video + 1) % 6] = 1.0  # every caption prefers the next clip ...
    scores[0, 0] = 2.0  # ... but caption 0
    return scores, text_video


def _below_chance_retrieval() -> dict[str, float]:
    """The figures of :func:`_below_chance_ranking`: t2v R@1 = 8.33 against chance 16.67."""
    from vlp.eval.retrieval import chance_metrics

    scores, text_video = _below_chance_ranking()
    metrics = retrieval_metrics(scores, text_video) | chance_metrics(text_video, 6)
    return metrics | {"num_texts": 12.0, "num_videos": 6.0}


def test_a_below_chance_retrieval_report_says_so(tmp_path: Path) -> None:
    metrics = _below_chance_retrieval() | {"pairs_scored": 0.0}
    assert metrics["t2v_r1"] == pytest.approx(100 / 12) and metrics["chance_t2v_r1"] == pytest.approx(100 / 6)
    retrieval_report(metrics, [1] + [6] * 11, [], tmp_path)
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| text → video R@1 | 8.33 | 16.67 | below chance |" in md
    assert "**Warning:** text → video R@1 8.33 is below chance (16.67)" in md
    text = "".join(_parse(tmp_path / "report.html").text)
    assert "below chance" in text and "Warning:" in text


@pytest.mark.parametrize(
    ("recorded", "shown"),
    [
        ({"pairs_scored": 0.0}, False),  # TS2-Net (or a model without VTM): the similarity is the ranking
        ({"pairs_scored": 120.0}, True),  # ALPRO / ALBEF: a fused pass re-ranked the similarity's top-k
        ({"pairs_scored": 0.0, "rescored": 1.0}, True),  # test-time re-scoring ranked a re-scored matrix
        ({}, True),  # not recorded: shown, as before
    ],
)
def test_the_similarity_only_row_follows_how_the_ranking_was_made(tmp_path: Path, recorded, shown) -> None:
    """Decided by definition: here the similarity figures equal the main ones in every case."""
    from vlp.report import headline_table

    metrics = _below_chance_retrieval()
    metrics |= {f"vtc_{k}": v for k, v in retrieval_metrics(*_below_chance_ranking()).items()} | recorded
    retrieval_report(metrics, [1] + [6] * 11, [], tmp_path)
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    html_text = "".join(_parse(tmp_path / "report.html").text)
    assert ("| vtc text → video | 8.33 |" in md) is shown
    assert ("vtc video → text" in html_text) is shown and ("similarity only" in md) is shown
    assert ("vtc_rsum" in md) is shown  # the similarity ranking's other figures go with its row
    assert md.count("text → video | 8.33 |") == (2 if shown else 1)  # the main row, and the similarity's if shown
    row = headline_table({"retrieval": metrics}).split("| retrieval | text → video R@1 |")[1].split("\n")[0]
    assert row.split("|")[1].strip() == ("8.33" if shown else "")  # value | similarity only | chance


def test_ranking_is_similarity_reads_how_the_figures_were_made() -> None:
    from vlp.report import ranking_is_similarity

    assert ranking_is_similarity({"pairs_scored": 0.0}) is True
    assert ranking_is_similarity({"pairs_scored": 3.0}) is False
    assert ranking_is_similarity({"pairs_scored": 0.0, "rescored": 1.0}) is False
    assert ranking_is_similarity({"t2v_r1": 1.0, "vtc_t2v_r1": 1.0}) is None  # not recorded


def test_the_headline_table_carries_verdicts() -> None:
    from vlp.report import VERDICT_RULES, headline_table

    retrieval = _below_chance_retrieval() | {"pairs_scored": 0.0, "vtm_loss": 0.7, "vtm_loss_prior": 0.6365}
    qa = {"accuracy": 0.42, "majority_accuracy": 0.2, "chance_accuracy": 0.01, "n": 500.0}
    table = headline_table({"retrieval": retrieval, "qa": qa})
    assert table.startswith("| task |") and table.endswith("\n\n" + VERDICT_RULES + "\n")  # the table, then rules
    assert "Retrieval verdicts" not in headline_table({"qa": qa}) and "QA verdicts" in headline_table({"qa": qa})
    assert "| retrieval | text → video R@1 | 8.33 |  | 16.67 |  | **below chance** |" in table
    assert "| retrieval | held-out VTM loss (lower is better) | 0.70 |  | 0.64 (label prior) |  | " \
           "**worse than the label prior** |" in table  # fmt: skip
    assert "| qa | accuracy (%) | 42.00 |  | 1.00 | 20.00 | above the majority baseline by 22.00 points |" in table
    rows = [line for line in table.splitlines() if line.startswith("| retrieval") or line.startswith("| qa")]
    assert len(rows) == 8 + 1 + 1 and all(line.split("|")[-2].strip() for line in rows)  # every row has a verdict


def test_a_qa_report_states_its_verdict(tmp_path: Path) -> None:
    from vlp.eval.qa import qa_baselines

    gold = ["red"] * 6 + ["blue", "two"]
    metrics = qa_metrics(["two"] * 8, gold, ["color"] * 7 + ["count"], vocab=["red", "blue", "two"])
    metrics |= qa_baselines(gold, ["red", "blue", "two"], "red")  # majority 6/8, chance 1/3
    qa_report(metrics, tmp_path, majority_answer="red")
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| accuracy (%) | 12.50 | 33.33 | 75.00 | below chance |" in md
    assert "**Warning:** accuracy (%) 12.50 is below chance (33.33)" in md
    metrics["accuracy"] = 7 / 8
    qa_report(metrics, tmp_path, majority_answer="red")
    assert "above the majority baseline by 12.50 points" in (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Warning" not in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_rescored_figures_record_that_they_were_rescored() -> None:
    from vlp.eval.retrieval import rescored_metrics

    scores, text_video = _below_chance_ranking()
    assert rescored_metrics(scores, text_video, "dual_softmax")["rescored"] == 1.0
    assert "rescored" not in retrieval_metrics(scores, text_video)
