"""Report files people look at: retrieval and QA reports (Markdown + self-contained HTML) and their verdicts.

Everything here writes to a **local directory** only (``out_dir`` / ``path`` must not be a URI); the step that
calls it writes to a temporary directory and uploads the files with :mod:`vlp.storage`. Images are drawn with
PIL (no plotting library). The HTML files inline every image as a base64 data URI, so a single file renders in
the KFP UI or as an MLflow artifact; the Markdown files link the PNG/JPEG files written next to them.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

__all__ = [
    "headline_table",
    "qa_report",
    "rank_histogram",
    "ranking_is_similarity",
    "retrieval_report",
    "verdict",
]

RANK_BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 20), (21, 50), (51, 100), (101, None))
_DIRECTIONS = (("t2v", "text → video"), ("v2t", "video → text"))
_RANK_COLUMNS = (("r1", "R@1"), ("r5", "R@5"), ("r10", "R@10"), ("medr", "MdR"), ("meanr", "MnR"))
_THUMB = (112, 112)
_CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}th{background:#eee}"
    "td.q{text-align:left;max-width:24em}figure{display:inline-block;margin:4px;text-align:center;font-size:12px}"
    "figure img{border:3px solid #ccc}figure.ok img{border-color:#1a9e3a}figure.ok figcaption{color:#1a9e3a}"
)


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: fixed-size bitmap font
        return ImageFont.load_default()


def _local_dir(out_dir: str | Path) -> Path:
    if "://" in str(out_dir):
        raise ValueError(
            f"reports are written to a local directory, got {out_dir!r}; write to a temporary directory "
            "and upload it with vlp.storage"
        )
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _html_page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_CSS}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[str, str]:
    """The same table as Markdown and as HTML."""
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return "\n".join(md), f"<table><tr>{head}</tr>{body}</table>"


_RETRIEVAL_RULES = (
    "Retrieval verdicts: recalls and median ranks against chance as a ratio (6.30x: 6.3 times chance's recall, or "
    "chance's median rank over the model's); *at chance* = less than one query's worth away (100 / queries points "
    "of recall, the texts for text → video and the videos for video → text; one rank of median rank; the VTM loss "
    "only when equal to the label prior's)."
)
_QA_RULES = (
    "QA verdicts: accuracy against the majority-answer baseline in percentage points, and *below chance* under "
    "chance; *equal* / *at chance* = less than one question's worth away (100 / questions points)."
)
_NO_COUNT = "Without a count of queries or questions, only an equal figure is at a level."
_SIMILARITY_ONLY = (
    "*Similarity only*: the ranking a fused pass re-ranks (or test-time re-scoring re-scores); blank where the "
    "figure's ranking is that similarity itself."
)
VERDICT_RULES = f"{_RETRIEVAL_RULES} {_SIMILARITY_ONLY} {_QA_RULES} {_NO_COUNT}"
"""How :func:`verdict` is applied to the headline figures, and what the similarity-only column holds: what
:func:`headline_table` states above a table of both tasks (the reports state their task's part)."""
_FLAGGED = ("below chance", "worse than")


def verdict(
    value: float,
    chance: float | None,
    tolerance: float = 0.0,
    *,
    majority: float | None = None,
    lower_is_better: bool = False,
    level: str = "chance",
) -> str:
    """What ``value`` says against its reference levels, in words.

    ``value`` is *at* a level when ``|value - level| < tolerance`` (a difference of exactly ``tolerance``, one
    query's worth, is a real difference), or when the two are equal up to float rounding. Otherwise:

    * below ``chance`` (the worse side, beyond tolerance): ``"below chance"`` (``"worse than chance"`` when
      ``lower_is_better``), whatever the majority baseline says;
    * with a ``majority`` baseline (QA accuracy, pass percent): ``"above the majority baseline by 3.10 points"``,
      ``"equal to the majority baseline"`` or ``"below the majority baseline"``;
    * else against ``chance`` as a ratio: ``"above chance by 6.25x"`` (``"better than chance by 6.25x"``, the ratio
      chance / value, when ``lower_is_better``), ``"at chance"``; no ratio when the denominator is 0;
    * neither level given: ``"no baseline recorded"``; a NaN ``value``: ``"no verdict: the figure is NaN"``.

    Args:
        value: the figure (a recall, an accuracy, a rank, a loss).
        chance: what a random predictor scores (``level`` names it), or None when unknown.
        tolerance: the band around each level that counts as *at* it, in the figure's units (>= 0).
        majority: the majority-answer baseline, or None.
        lower_is_better: ranks and losses.
        level: the name of ``chance`` in the words (``"the label prior"`` for the VTM loss).
    """
    if math.isnan(value):
        return "no verdict: the figure is NaN"
    better, worse = ("better than", "worse than") if lower_is_better else ("above", "below")

    def near(ref: float) -> bool:
        return abs(value - ref) < tolerance * (1 - 1e-9) or math.isclose(value, ref, rel_tol=1e-9, abs_tol=1e-12)

    def beats(ref: float) -> bool:
        return value < ref if lower_is_better else value > ref

    if chance is not None and not near(chance) and not beats(chance):
        return f"{worse} {level}"
    if majority is not None:
        if near(majority):
            return "equal to the majority baseline"
        if beats(majority):
            return f"{better} the majority baseline by {abs(value - majority):.2f} points"
        return f"{worse} the majority baseline"
    if chance is None:
        return "no baseline recorded"
    if near(chance):
        return f"at {level}"
    num, den = (chance, value) if lower_is_better else (value, chance)
    return f"{better} {level} by {num / den:.2f}x" if den > 0 else f"{better} {level} ({level} is 0)"


def ranking_is_similarity(metrics: Mapping[str, Any]) -> bool | None:
    """Whether the main ranking of a retrieval evaluation is, by definition, the similarity ranking it also stores
    as ``vtc_*``: True when ``evaluate-retrieval`` recorded no fused re-ranking pass (``pairs_scored == 0``: the
    family has no pair scorer, e.g. TS2-Net, or the model's ``reranks`` is False) and no test-time re-scoring (no
    ``rescored`` flag, which
    :func:`vlp.eval.retrieval.rescored_metrics` sets); False when either happened; None when ``metrics`` do not say
    (no ``pairs_scored``). Decided from how the figures were made, never by comparing them."""
    if "pairs_scored" not in metrics:
        return None
    return not metrics["pairs_scored"] and not metrics.get("rescored")


@dataclass(frozen=True)
class _Headline:
    """One headline figure with its reference levels and the verdict computed from them."""

    figure: str
    value: float
    similarity: float | None = None  # the similarity-only ranking's figure, where a fused pass re-ranks
    chance: float | None = None
    majority: float | None = None
    verdict: str = ""
    chance_note: str = ""  # e.g. " (label prior)"

    def cells(self, *, similarity: bool, majority: bool) -> list[Any]:
        level = "" if self.chance is None else f"{self.chance:.2f}{self.chance_note}"
        row = [self.figure, self.value, *([_blank(self.similarity)] if similarity else []), level]
        return [*row, *([_blank(self.majority)] if majority else []), self.verdict]


def _blank(value: float | None) -> Any:
    return "" if value is None else value


def _retrieval_headlines(m: Mapping[str, Any]) -> list[_Headline]:
    """R@1/5/10 and MdR of both directions against chance, and the held-out VTM loss against the label prior."""
    out = []
    show_similarity = not ranking_is_similarity(m)
    for direction, count in (("t2v", "num_texts"), ("v2t", "num_videos")):
        one_query = 100.0 / m[count] if m.get(count) else 0.0
        for key, label in _RANK_COLUMNS[:4]:
            name = f"{direction}_{key}"
            if name not in m:
                continue
            rank = key == "medr"
            chance = m.get(f"chance_{name}")
            words = verdict(m[name], chance, 1.0 if rank else one_query, lower_is_better=rank)
            similarity = m.get(f"vtc_{name}") if show_similarity else None
            out.append(_Headline(f"{_direction_label(direction)} {label}", m[name], similarity, chance, None, words))
    if "vtm_loss" in m:  # the VTM head on held-out hard negatives; its trivial level is the 1:2 label prior
        prior = m.get("vtm_loss_prior")
        words = verdict(m["vtm_loss"], prior, lower_is_better=True, level="the label prior")
        out.append(_Headline("held-out VTM loss (lower is better)", m["vtm_loss"], None, prior, None, words,
                             " (label prior)"))  # fmt: skip
    return out


def _qa_headlines(m: Mapping[str, Any]) -> list[_Headline]:
    """QA accuracy (percent) against chance and the majority-answer baseline."""
    if "accuracy" not in m:
        return []
    chance, majority = (100.0 * m[k] if k in m else None for k in ("chance_accuracy", "majority_accuracy"))
    accuracy, one_question = 100.0 * m["accuracy"], 100.0 / m["n"] if m.get("n") else 0.0
    words = verdict(accuracy, chance, one_question, majority=majority)
    return [_Headline("accuracy (%)", accuracy, None, chance, majority, words)]


def _flags(headlines: Sequence[_Headline]) -> list[str]:
    """A plain sentence for every figure on the wrong side of chance (or of the VTM loss's label prior)."""
    trivial = {"": "a random guess does better on average", " (label prior)": "predicting the label prior does better"}
    return [
        f"{h.figure} {h.value:.2f} is {h.verdict} ({h.chance:.2f}): {trivial.get(h.chance_note, 'chance does better')}."
        for h in headlines
        if h.chance is not None and h.verdict.startswith(_FLAGGED)
    ]


def _verdict_section(headlines: Sequence[_Headline], rules: str, *, majority: bool) -> tuple[str, str]:
    """The verdict table (Markdown, HTML) with the rules above it and any below-chance figure called out."""
    similarity = any(h.similarity is not None for h in headlines)
    header = ["figure", "value", *(["similarity only"] if similarity else []), "chance"]
    header += [*(["majority answer"] if majority else []), "verdict"]
    md_table, html_table = _table(header, [h.cells(similarity=similarity, majority=majority) for h in headlines])
    flags = _flags(headlines)
    rules = f"{rules} {_NO_COUNT}"
    md = ["## Verdict", "", rules, "", *(f"- **Warning:** {f}" for f in flags), *([""] if flags else []), md_table]
    md.append("")
    htm = ["<h2>Verdict</h2>", f"<p>{html.escape(rules.replace('*', ''))}</p>"]
    htm += [f"<p><strong>Warning:</strong> {html.escape(f)}</p>" for f in flags] + [html_table]
    return "\n".join(md), "\n".join(htm)


def rank_histogram(ranks: Tensor | np.ndarray | Sequence[int]) -> tuple[Image.Image, list[tuple[str, int]]]:
    """Bar chart of 1-based ranks in the bins ``1, 2, 3-5, 6-10, 11-20, 21-50, 51-100, >100``.

    Returns:
        ``(PIL image, [(bin label, count)])``.
    """
    values = np.asarray(ranks.cpu() if isinstance(ranks, torch.Tensor) else ranks, dtype=np.int64).ravel()
    counts = []
    for lo, hi in RANK_BINS:
        label = str(lo) if hi == lo else (f">{lo - 1}" if hi is None else f"{lo}-{hi}")
        inside = (values >= lo) & (values <= hi if hi is not None else True)
        counts.append((label, int(inside.sum())))
    width, height, pad, bar = 560, 260, 40, 56
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font = _font(12)
    top = max(c for _, c in counts) or 1
    draw.text((pad, 8), f"rank of the correct item (n = {values.size})", fill="black", font=font)
    for i, (label, count) in enumerate(counts):
        x0 = pad + i * (bar + 8)
        y0 = height - pad - int((height - 2 * pad - 10) * count / top)
        draw.rectangle((x0, y0, x0 + bar, height - pad), fill="#4a78c2")
        draw.text((x0 + 2, y0 - 15), str(count), fill="black", font=font)
        draw.text((x0 + 2, height - pad + 6), label, fill="black", font=font)
    draw.line((pad - 4, height - pad, width - 8, height - pad), fill="black")
    return img, counts


def _direction_label(prefix: str) -> str:
    for short, name in _DIRECTIONS:
        if prefix == short or prefix.endswith(f"_{short}"):
            return prefix.removesuffix(short).replace("_", " ") + name
    return prefix


def _metric_rows(metrics: Mapping[str, Any]) -> tuple[list[list[Any]], dict[str, Any]]:
    """One row per prefix that has all five rank columns (``t2v``, ``v2t``, ``vtc_t2v``, ...); the rest apart.

    The similarity-only figures (``vtc_*``) are left out where :func:`ranking_is_similarity` says the main ranking
    is that same similarity ranking (they would repeat the main rows)."""
    if ranking_is_similarity(metrics):
        metrics = {k: v for k, v in metrics.items() if not k.startswith("vtc_")}
    rows, used = [], set()
    for key in metrics:
        prefix = key.removesuffix("_r1")
        keys = [f"{prefix}_{c}" for c, _ in _RANK_COLUMNS]
        if key.endswith("_r1") and all(k in metrics for k in keys):
            rows.append([_direction_label(prefix), *(metrics[k] for k in keys)])
            used.update(keys)
    rest = {k: v for k, v in metrics.items() if k not in used}
    return rows, rest


def _thumb(jpeg: bytes | None) -> Image.Image:
    if not jpeg:
        return Image.new("RGB", _THUMB, "#999999")
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    img.thumbnail(_THUMB)
    return img


def _check_examples(examples: Sequence[Mapping[str, Any]]) -> None:
    for i, ex in enumerate(examples):
        missing = {"query", "correct_video", "top5"} - set(ex)
        if missing:
            raise ValueError(f"example {i} lacks {sorted(missing)}; each needs query, correct_video and top5")
        for item in ex["top5"]:
            if len(item) != 3:
                raise ValueError(f"example {i}: top5 items must be (video_id, score, jpeg_bytes), got {item!r}")


def _examples_section(examples: Sequence[Mapping[str, Any]], out: Path) -> tuple[str, str, list[str]]:
    md, htm, paths = ["## Example queries (top-5 videos; ✓ = correct)", ""], ["<h2>Example queries</h2>"], []
    for i, ex in enumerate(examples):
        hit = any(str(v) == str(ex["correct_video"]) for v, _, _ in ex["top5"])
        note = "" if hit else f" — correct video `{ex['correct_video']}` not in the top 5"
        md += [f"**{i + 1}. {ex['query']}**{note}", ""]
        htm.append(f"<h3>{i + 1}. {html.escape(str(ex['query']))}{html.escape(note.replace('`', ''))}</h3><div>")
        for j, (video_id, score, jpeg) in enumerate(ex["top5"]):
            ok = str(video_id) == str(ex["correct_video"])
            thumb = _thumb(jpeg)
            name = f"thumbs/q{i}_{j}.png"
            (out / "thumbs").mkdir(exist_ok=True)
            thumb.save(out / name)
            paths.append(str(out / name))
            mark = " ✓" if ok else ""
            md.append(f"{j + 1}. ![{video_id}]({name}) `{video_id}` score {score:.4f}{mark}")
            caption = html.escape(f"{j + 1}. {video_id} ({score:.4f}){mark}")
            cls = ' class="ok"' if ok else ""
            htm.append(
                f'<figure{cls}><img src="{_data_uri(_png(thumb), "image/png")}" alt="{html.escape(str(video_id))}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
        md.append("")
        htm.append("</div>")
    return "\n".join(md), "\n".join(htm), paths


def retrieval_report(
    metrics: Mapping[str, Any],
    t2v_ranks: Tensor | np.ndarray | Sequence[int],
    examples: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
) -> list[str]:
    """Write ``report.md`` and a self-contained ``report.html`` for one retrieval evaluation.

    Contents: the verdict table (each headline figure, R@1/5/10 and MdR per direction and the held-out VTM loss,
    next to chance, the similarity-only figure where the main ranking is not the similarity ranking, and its
    :func:`verdict`; a warning line for each figure on the wrong side of chance), the metrics table (R@1/5/10 in
    percent, MdR, MnR per direction, a similarity-only row per direction unless :func:`ranking_is_similarity`;
    every other scalar in ``metrics``, e.g. ``rsum`` or timings, listed below it), the text->video rank
    histogram, and each example query with its top-5 videos as thumbnails, the correct one marked with ✓ (and a
    note when it is not in the top 5).

    Args:
        metrics: as :func:`vlp.eval.retrieval.retrieval_metrics` returns, optionally with extra scalar keys.
        t2v_ranks: 1-based text->video ranks (:func:`vlp.eval.retrieval.ranks_t2v`).
        examples: ``[{"query": str, "correct_video": str, "top5": [(video_id, score, jpeg_bytes | None)]}]``.
        out_dir: local directory (created if needed; not a URI).

    Returns:
        Paths written: ``report.md``, ``report.html``, ``rank_histogram.png``, then ``thumbs/*.png``.
    """
    _check_examples(examples)
    out = _local_dir(out_dir)
    hist, counts = rank_histogram(t2v_ranks)
    hist.save(out / "rank_histogram.png")
    rows, rest = _metric_rows(metrics)
    md_table, html_table = _table(["direction", *(n for _, n in _RANK_COLUMNS)], rows)
    md_rest, html_rest = _table(["metric", "value"], [[k, v] for k, v in rest.items()])
    md_hist, html_hist = _table(["rank", *(label for label, _ in counts)], [["texts", *(c for _, c in counts)]])
    md_ex, html_ex, thumbs = _examples_section(examples, out)
    md_verdict, html_verdict = _verdict_section(_retrieval_headlines(metrics), _RETRIEVAL_RULES, majority=False)
    vtc = any(row[0].startswith("vtc ") for row in rows)
    note = (
        "`vtc` rows: the similarity-only ranking (VTC / ITC, or TS2-Net's frame score) before re-ranking or re-scoring."
    )
    md = [
        "# Retrieval report",
        "",
        "Recalls in percent; ranks 1-based, ties counted against the query.",
        "",
        md_verdict,
        "## Every figure",
        "",
        *([note, ""] if vtc else []),
        md_table,
        "",
        md_rest if rest else "",
        "",
        "## Text → video rank histogram",
        "",
        "![rank histogram](rank_histogram.png)",
        "",
        md_hist,
        "",
        md_ex,
    ]
    body = "\n".join(
        [
            "<p>Recalls in percent; ranks 1-based, ties counted against the query.</p>",
            html_verdict,
            "<h2>Every figure</h2>",
            f"<p>{html.escape(note.replace('`', ''))}</p>" if vtc else "",
            html_table,
            html_rest if rest else "",
            "<h2>Text → video rank histogram</h2>",
            f'<img src="{_data_uri(_png(hist), "image/png")}" alt="rank histogram">',
            html_hist,
            html_ex,
        ]
    )
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    (out / "report.html").write_text(_html_page("Retrieval report", body), encoding="utf-8")
    return [str(out / "report.md"), str(out / "report.html"), str(out / "rank_histogram.png"), *thumbs]


def headline_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown: each headline figure of each evaluation next to the levels it must beat, with its verdict.

    ``results`` maps a task (``retrieval``, ``qa``) to its ``metrics.json``. Retrieval rows (R@1/5/10 in percent,
    MdR, both directions) show chance (:func:`vlp.eval.retrieval.chance_metrics`) and, where a fused pass re-ranks
    or test-time re-scoring ranks (:func:`ranking_is_similarity` is not True), the similarity-only ranking it
    started from (VTC / ITC, or TS2-Net's frame score); the QA row shows the majority-answer baseline and chance
    (:func:`vlp.eval.qa.qa_baselines`); the held-out VTM loss (:func:`vlp.eval.retrieval.heldout_vtm`) shows the
    loss of predicting the label prior. The last column is :func:`verdict` of the figure against those levels
    (bold when it is on the wrong side of chance); the rules of :data:`VERDICT_RULES` that apply to the tasks given
    follow the table. A missing level is left blank.
    """
    rows = [
        "| task | figure | value | similarity only | chance | majority answer | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    any_retrieval = any_qa = False
    for task, m in results.items():
        retrieval, qa = _retrieval_headlines(m), _qa_headlines(m)
        any_retrieval, any_qa = any_retrieval or bool(retrieval), any_qa or bool(qa)
        for h in [*retrieval, *qa]:
            words = f"**{h.verdict}**" if h.chance is not None and h.verdict.startswith(_FLAGGED) else h.verdict
            cells = [task, *(_fmt(c) for c in h.cells(similarity=True, majority=True)[:-1]), words]
            rows.append("| " + " | ".join(cells) + " |")
    rules = [_RETRIEVAL_RULES, _SIMILARITY_ONLY] * any_retrieval + [_QA_RULES] * any_qa
    return "\n".join([*rows, "", " ".join([*rules, _NO_COUNT])]) + "\n"  # the table first: what a reader wants


def _qa_tables(metrics: Mapping[str, Any], majority: str | None) -> list[tuple[str, str, tuple[str, str]]]:
    confusion: Mapping[str, Mapping[str, int]] = metrics.get("confusion", {})
    baselines = []
    if "majority_accuracy" in metrics:
        guess = f" (always {majority!r})" if majority is not None else ""
        baselines.append([f"majority-answer baseline{guess} (%)", 100.0 * metrics["majority_accuracy"]])
    if "chance_accuracy" in metrics:
        baselines.append(["chance: a random vocabulary answer (%)", 100.0 * metrics["chance_accuracy"]])
    overall = [
        ["accuracy (%)", 100.0 * metrics["accuracy"]],
        *baselines,
        ["accuracy on in-vocabulary questions (%)", 100.0 * metrics.get("acc_in_vocab", 0.0)],
        ["out-of-vocabulary answers (%)", 100.0 * metrics.get("oov_rate", 0.0)],
        ["questions", metrics.get("n", "")],
        ["questions with an out-of-vocabulary answer (counted wrong)", metrics.get("n_oov", "")],
    ]
    kinds = sorted(k.removeprefix("acc_") for k in metrics if k.startswith("acc_") and k != "acc_in_vocab")
    per_type = [[k, 100.0 * metrics[f"acc_{k}"], sum(confusion.get(k, {}).values())] for k in kinds]
    columns = sorted({c for row in confusion.values() for c in row}, key=lambda c: (c in ("oov", "unseen"), c))
    matrix = [[kind, *(row.get(c, 0) for c in columns)] for kind, row in confusion.items()]
    return [
        ("Overall", "", _table(["metric", "value"], overall)),
        ("Accuracy per answer type", "", _table(["answer type", "accuracy (%)", "questions"], per_type)),
        (
            "Confusion by answer type",
            "Rows: gold answer type. Columns: type of the predicted answer (the type it most often has in the gold "
            "data); `oov` = gold answer outside the vocabulary; `unseen` = predicted answer never a gold answer.",
            _table(["gold ↓ / predicted →", *columns], matrix),
        ),
    ]


def qa_report(metrics: Mapping[str, Any], out_dir: str | Path, *, majority_answer: str | None = None) -> list[str]:
    """Write ``report.md`` and ``report.html`` for one QA evaluation: the verdict of the accuracy against chance and
    the majority-answer baseline (:func:`verdict`, one question's worth of tolerance), then the tables.

    Args:
        metrics: as :func:`vlp.eval.qa.qa_metrics` returns (fractions; shown here in percent), with the
            baselines of :func:`vlp.eval.qa.qa_baselines` when given (shown under the accuracy).
        out_dir: local directory (created if needed; not a URI).
        majority_answer: the majority baseline's constant answer, named in the report.

    Returns:
        Paths written: ``report.md``, ``report.html``.
    """
    if "accuracy" not in metrics:
        raise ValueError("QA metrics lack 'accuracy'; pass the dict vlp.eval.qa.qa_metrics returns")
    out = _local_dir(out_dir)
    md_verdict, html_verdict = _verdict_section(_qa_headlines(metrics), _QA_RULES, majority=True)
    md, body = ["# Video QA report", "", md_verdict], [html_verdict]
    for title, note, (md_table, html_table) in _qa_tables(metrics, majority_answer):
        md += [f"## {title}", "", *([note, ""] if note else []), md_table, ""]
        body += [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(note)}</p>" if note else "", html_table]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    (out / "report.html").write_text(_html_page("Video QA report", "\n".join(body)), encoding="utf-8")
    return [str(out / "report.md"), str(out / "report.html")]
