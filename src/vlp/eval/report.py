"""Report files people look at: retrieval and QA reports (Markdown + self-contained HTML) and the PEM figure.

Everything here writes to a **local directory** only (``out_dir`` / ``path`` must not be a URI); the step that
calls it writes to a temporary directory and uploads the files with :mod:`vlp.storage`. Images are drawn with
PIL (no plotting library). The HTML files inline every image as a base64 data URI, so a single file renders in
the KFP UI or as an MLflow artifact; the Markdown files link the PNG/JPEG files written next to them.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

__all__ = ["pem_figure", "qa_report", "rank_histogram", "retrieval_report"]

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
    """One row per prefix that has all five rank columns (``t2v``, ``v2t``, ``vtc_t2v``, ...); the rest apart."""
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

    Contents: the metrics table (R@1/5/10 in percent, MdR, MnR per direction; every other scalar in ``metrics``,
    e.g. ``rsum`` or timings, listed below it), the text->video rank histogram, and each example query with its
    top-5 videos as thumbnails, the correct one marked with ✓ (and a note when it is not in the top 5).

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
    md = [
        "# Retrieval report",
        "",
        "Recalls in percent; ranks 1-based, ties counted against the query.",
        "",
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
    """Markdown: each headline figure of each evaluation next to the levels it must beat.

    ``results`` maps a task (``retrieval``, ``qa``) to its ``metrics.json``. Retrieval rows (R@1/5/10 in percent,
    MdR, both directions) show the similarity-only ranking (VTC / ITC, or TS2-Net's frame score: the ranking before
    any re-ranking) and chance (:func:`vlp.eval.retrieval.chance_metrics`); the QA row shows the majority-answer
    baseline and chance (:func:`vlp.eval.qa.qa_baselines`); the held-out VTM loss
    (:func:`vlp.eval.retrieval.heldout_vtm`) shows the loss of predicting the label prior. A missing level is left
    blank.
    """

    def cell(value: float | None, scale: float = 1.0) -> str:
        return "" if value is None else f"{scale * value:.2f}"

    rows = ["| task | figure | value | similarity only | chance | majority answer |", "|---|---|---|---|---|---|"]
    for task, m in results.items():
        if "t2v_r1" in m:
            for direction in ("t2v", "v2t"):
                for key, label in _RANK_COLUMNS[:4]:
                    name = f"{direction}_{key}"
                    figure = f"{_direction_label(direction)} {label}"
                    rows.append(f"| {task} | {figure} | {cell(m.get(name))} | {cell(m.get('vtc_' + name))} | "
                                f"{cell(m.get('chance_' + name))} |  |")  # fmt: skip
        if "vtm_loss" in m:  # the VTM head on held-out hard negatives; its trivial level is the 1:2 label prior
            rows.append(f"| {task} | held-out VTM loss (lower is better) | {cell(m['vtm_loss'])} |  | "
                        f"{cell(m.get('vtm_loss_prior'))} (label prior) |  |")  # fmt: skip
        if "accuracy" in m:
            chance, majority = cell(m.get("chance_accuracy"), 100), cell(m.get("majority_accuracy"), 100)
            rows.append(f"| {task} | accuracy (%) | {cell(m['accuracy'], 100)} |  | {chance} | {majority} |")
    return "\n".join(rows) + "\n"


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
    """Write ``report.md`` and ``report.html`` for one QA evaluation.

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
    md, body = ["# Video QA report", ""], []
    for title, note, (md_table, html_table) in _qa_tables(metrics, majority_answer):
        md += [f"## {title}", "", *([note, ""] if note else []), md_table, ""]
        body += [f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(note)}</p>" if note else "", html_table]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    (out / "report.html").write_text(_html_page("Video QA report", "\n".join(body)), encoding="utf-8")
    return [str(out / "report.md"), str(out / "report.html")]


def _as_images(frames: Sequence[Image.Image] | np.ndarray) -> list[Image.Image]:
    if isinstance(frames, np.ndarray):
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"frames array must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
        return [Image.fromarray(f) for f in frames]
    images = [f.convert("RGB") for f in frames]
    if not images or len({im.size for im in images}) != 1:
        raise ValueError("pem_figure needs at least one frame, all of the same size")
    return images


def pem_figure(
    frames: Sequence[Image.Image] | np.ndarray,
    box: tuple[float, float, float, float],
    top5: Sequence[tuple[str, float]],
    path: str | Path,
    height: int = 128,
) -> str:
    """Draw a PEM example like ALPRO Fig. 3: frames side by side with the crop box, and the prompter's top-5.

    Args:
        frames: the clip's frames, PIL images or a uint8 ``(T, H, W, 3)`` array, all the same size.
        box: the crop ``(x0, y0, x1, y1)`` in pixels of the frames (drawn on every frame).
        top5: ``[(entity, probability)]``, best first; drawn as labelled bars (probabilities in [0, 1]).
        path: local PNG path (parent directories are created).
        height: frame height in the figure; frames keep their aspect ratio.

    Returns:
        ``str(path)``.
    """
    images = _as_images(frames)
    if not images:
        raise ValueError("pem_figure needs at least one frame")
    w, h = images[0].size
    x0, y0, x1, y1 = box
    if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
        raise ValueError(f"box {box} must satisfy 0 <= x0 < x1 <= {w} and 0 <= y0 < y1 <= {h} (frame pixels)")
    if not top5:
        raise ValueError("top5 must hold at least one (entity, probability) pair")
    scale = height / h
    fw, gap, line = max(1, round(w * scale)), 4, 22
    font = _font(14)
    bar_x = gap + 12 + int(max(font.getlength(str(e)) for e, _ in top5))  # bars start right of the longest name
    width = max(len(images) * (fw + gap) + gap, bar_x + 260 + 70)
    canvas = Image.new("RGB", (width, height + 2 * gap + 24 + line * len(top5)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, frame in enumerate(images):
        left = gap + i * (fw + gap)
        canvas.paste(frame.resize((fw, height)), (left, gap))
        rect = (left + x0 * scale, gap + y0 * scale, left + x1 * scale - 1, gap + y1 * scale - 1)
        draw.rectangle(rect, outline="#ff2020", width=2)
    top = height + 2 * gap
    draw.text((gap, top), f"prompter top-{len(top5)} entities for the crop", fill="black", font=font)
    for j, (entity, prob) in enumerate(top5):
        y = top + 24 + j * line
        draw.text((gap, y), str(entity), fill="black", font=font)
        bar = int(260 * min(max(float(prob), 0.0), 1.0))
        draw.rectangle((bar_x, y + 2, bar_x + max(bar, 1), y + line - 6), fill="#4a78c2")
        draw.text((bar_x + bar + 10, y), f"{float(prob):.3f}", fill="black", font=font)
    out = Path(path)
    if "://" in str(path):
        raise ValueError(f"pem_figure writes a local file, got {path!r}; upload it with vlp.storage afterwards")
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out, format="PNG")
    return str(out)
