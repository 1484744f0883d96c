"""The MLflow UI pages a vlp run points at open in a real browser: Debian's chromium driven by Playwright against a
real ``mlflow server`` holding a run that a vlp step logged and a model version vlp registered.

The experiment and run pages ask ``POST /graphql``; with graphene 2.0 that answered 500 and the pages showed
"Experiment load error" / "Can't load run details". Playwright never downloads a browser here: it launches
/usr/bin/chromium, which ``make browser`` (a dependency of ``make test``) installs with apt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from common import MlflowServer
from vlp import tracking
from vlp.config import load_config
from vlp.steps.pretrain import pretrain_prompter

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags chromium keeps calling out to a network that is not there.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
# What MLflow 3.17's UI shows when a page fails to load (strings from its built JS bundle).
ERROR_TEXTS = ["Experiment load error", "Can't load run details", "Experiment not found", "Page Not Found",
               "does not exist", "Request failed", "Something went wrong", "An error occurred", "Error fetching",
               "Failed to load"]  # fmt: skip
MODEL, ALIAS = "vlp-ui-prompter", "candidate"
WAIT_MS = 90_000  # generous: the first page load parses several MB of JS on a busy CPU

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} missing: `make test` installs it (`make browser`)"),
]


@pytest.fixture
def vlp_run(tiny_world: dict[str, str], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real ``mlflow server`` with one run logged by the pretrain-prompter step and its output registered
    as version ``version`` of ``MODEL`` with alias ``ALIAS``, as the pipeline's final report registers models."""
    server = MlflowServer(tmp_path)
    server.start()
    try:
        overrides = [f"tracking.tracking_uri={server.url}", "tracking.experiment=vlp-ui", "pretrain.max_steps=2"]
        cfg = load_config(TINY, overrides)
        out = str(tmp_path / "prompter")
        summary = pretrain_prompter(tiny_world["dataset"], tiny_world["frames"], out, cfg)
        run = tracking.client(cfg.tracking).get_run(summary["tracking"]["run_id"])
        run_id, loss = run.info.run_id, run.data.metrics["train/loss_vtc"]  # the value the run page shows
        version = tracking.register_model(cfg.tracking, MODEL, out, run_id, {"loss_vtc": loss}, alias=ALIAS)
        yield {"url": server.url, "experiment": run.info.experiment_id, "run_id": run_id,
               "run_name": run.info.run_name, "loss": loss, "version": version}  # fmt: skip
    finally:
        server.kill()


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Any]:
    """A chromium page (fresh profile) with ``page.api_answers``: ``(status, method, url)`` of every
    ``/graphql`` and ``/ajax-api/`` response it got."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(WAIT_MS)
        new_page = context.new_page()
        answers: list[tuple[int, str, str]] = []

        def record(response: Any) -> None:
            if "/graphql" in response.url or "/ajax-api/" in response.url:
                answers.append((response.status, response.request.method, response.url))

        new_page.on("response", record)
        new_page.api_answers = answers
        try:
            yield new_page
        finally:
            context.close()
            browser.close()


def test_experiment_run_and_model_pages_open(vlp_run, page, tmp_path):
    url, exp, run_id, version = vlp_run["url"], vlp_run["experiment"], vlp_run["run_id"], vlp_run["version"]
    run_link = page.get_by_role("link", name=vlp_run["run_name"], exact=True)

    # The experiment page opens on the GenAI overview; "Model training" lists the runs.
    page.goto(f"{url}/#/experiments/{exp}")
    page.get_by_text("Model training", exact=True).click()
    shows(page, run_link, page.get_by_text("1 matching run"))
    check_page(page, tmp_path / "experiment.png")

    page.goto(f"{url}/#/experiments/{exp}/runs/{run_id}")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name="train/loss_vtc", exact=True))
    shows(page, row, page.get_by_role("link", name=MODEL))  # "Registered models" names the version of this run
    numbers = re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", row.inner_text().replace("train/loss_vtc", ""))
    assert numbers and float(numbers[0]) == pytest.approx(vlp_run["loss"], rel=1e-6), row.inner_text()
    row.scroll_into_view_if_needed()  # the metrics table is below the fold: have it in the screenshot
    check_page(page, tmp_path / "run.png")

    page.goto(f"{url}/#/models/{MODEL}")
    version_link = page.get_by_role("link", name=f"Version {version}", exact=True)
    alias = page.get_by_text(re.compile(rf"^@\s*{ALIAS}$"))  # "@ candidate" in the Aliases column
    shows(page, version_link, alias)
    check_page(page, tmp_path / "model.png")

    version_link.click()
    page.wait_for_url(f"**/#/models/{MODEL}/versions/{version}")
    title = page.get_by_role("heading", name=f"Version {version}", exact=True)
    shows(page, title, run_link, alias, page.get_by_text("metric.loss_vtc", exact=True))  # run_link: "Source Run"
    check_page(page, tmp_path / "version.png")

    assert any(a[2].endswith("/graphql") for a in page.api_answers), "the experiment and run pages ask POST /graphql"


def shows(page: Any, *wanted: Any) -> None:
    """Wait until each of ``wanted`` (locators) is visible, failing at once if an MLflow error text shows instead."""
    errors = page.get_by_text(re.compile("|".join(map(re.escape, ERROR_TEXTS)), re.IGNORECASE))
    for locator in wanted:
        locator.or_(errors).first.wait_for()
        no_errors(page)


def no_errors(page: Any) -> None:
    """No MLflow error text on ``page`` and no ``/graphql`` or ``/ajax-api/`` answer >= 500 so far."""
    text = page.inner_text("body")
    shown = [e for e in ERROR_TEXTS if e.lower() in text.lower()]
    failed = [a for a in page.api_answers if a[0] >= 500]
    assert not shown and not failed, f"{page.url} shows {shown}; server errors behind it: {failed}\n{text[:1500]}"


def check_page(page: Any, shot: Path) -> None:
    """:func:`no_errors`, then a screenshot of ``page`` at ``shot`` that is not blank."""
    from PIL import Image

    no_errors(page)
    page.screenshot(path=str(shot))
    with Image.open(shot) as img:
        rgb = img.convert("RGB")
        colours = len(rgb.getcolors(maxcolors=1 << 20) or [])
        grey = rgb.convert("L").histogram()  # a rendered page: ~20% off-white (panels), ~1.5% dark (text)
    off_white, dark = sum(grey[:250]) / sum(grey), sum(grey[:200]) / sum(grey)
    assert colours > 50 and off_white > 0.05 and dark > 0.003, (
        f"{shot} looks blank: {colours} colours, {off_white:.1%} off-white, {dark:.1%} dark pixels"
    )
