"""The page ``vlp serve`` serves at ``/``, in a real browser: Debian's chromium driven by Playwright against the real
server (``python -m vlp.cli serve`` on a loopback port) over a tiny ALPRO index, with a tiny ALPRO QA model (random
init) answering about its clips. Typing a query shows the hits in the order ``vlp search`` ranks them, with their
thumbnails; opening a hit shows its stored frames; asking a question lists the answers ``vlp answer`` gives, most
probable first; a screenshot of the page is not blank. Playwright never downloads a browser: it launches
/usr/bin/chromium, which ``make browser`` (a dependency of ``make test``) installs with apt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import sync_playwright

from test_answer import _save as save_qa_model
from test_index import captions
from test_mlflow_ui import CHROMIUM, CHROMIUM_ARGS
from test_serve import Server, build_index, config
from vlp.data import manifest
from vlp.data.frames import FrameStore
from vlp.data.video_text import normalize_answer
from vlp.eval.qa import build_answer_vocab
from vlp.index.answer import Answerer
from vlp.index.query import Searcher
from vlp.models import family
from vlp.models.tokenizer import train_wordpiece

WAIT_MS = 60_000
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} missing: `make browser` installs it")


@pytest.fixture(scope="module")
def qa_model(tiny_world, tmp_path_factory) -> str:
    qa = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()
    tok = train_wordpiece([r["question"] for r in qa] + [r["answer"] for r in qa], vocab_size=300)
    answers = build_answer_vocab([normalize_answer(r["answer"]) for r in qa if r["split"] == "train"], 40)
    root = tmp_path_factory.mktemp("page_qa")
    return save_qa_model(root / "qa", "alpro", family.get("alpro").kinds.qa, tok, answers)


@pytest.fixture(scope="module")
def index(tiny_world, tmp_path_factory) -> str:
    return build_index(tiny_world, tmp_path_factory.mktemp("page_index"))


@pytest.fixture(scope="module")
def server(index, qa_model, tmp_path_factory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("page_log") / "serve.log"
    srv = Server(log, "--index", index, "--qa-model", qa_model, "--port", "0")
    srv.wait_listening()
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait(10)


@pytest.fixture
def page() -> Iterator[Any]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(WAIT_MS)
        try:
            yield context.new_page()
        finally:
            browser.close()


def test_search_a_clip_see_its_frames_and_ask_about_it(server, index, qa_model, tiny_world, page, tmp_path) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + "/")
    about = page.locator("#about")
    about.filter(has_text="clips indexed").wait_for()
    assert "questions answered by the QA model" in about.inner_text()

    query = captions(tiny_world["dataset"])[0]
    expected = [hit.video_id for hit in Searcher(index, config()).search(query, 6)]
    page.fill("#k", "6")
    page.fill("#query", query)
    page.press("#query", "Enter")
    cards = page.locator("#hits li.hit")
    cards.nth(5).wait_for()
    assert [cards.nth(i).get_attribute("data-video-id") for i in range(cards.count())] == expected
    first = cards.first
    page.wait_for_function("() => [...document.querySelectorAll('#hits img')].every(i => i.complete)")
    assert page.evaluate("() => [...document.querySelectorAll('#hits img')].every(i => i.naturalWidth > 0)")

    first.click()
    stored = FrameStore(tiny_world["frames"]).num_stored(expected[0])
    page.locator("#frames img").nth(stored - 1).wait_for()
    assert page.locator("#frames img").count() == stored
    page.wait_for_function("() => [...document.querySelectorAll('#frames img')].every(i => i.complete)")
    assert page.evaluate("() => [...document.querySelectorAll('#frames img')].every(i => i.naturalWidth > 0)")

    qa = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()
    question = qa[0]["question"]
    wanted = Answerer(qa_model, config(), frames=tiny_world["frames"]).answer(expected[0], question, 5)
    page.fill("#question", question)
    page.click("#ask")
    answers = page.locator("#answers li.answer")
    answers.nth(len(wanted) - 1).wait_for()
    assert [answers.nth(i).get_attribute("data-answer") for i in range(answers.count())] == [a.answer for a in wanted]
    assert f"{100 * wanted[0].probability:.1f}%" in answers.first.inner_text()
    assert page.locator("#error").is_hidden() and errors == []

    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot), full_page=True)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float32)
    assert pixels.std() > 10 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 500, "the screenshot is blank"


def test_a_refused_query_shows_the_servers_message(server, page) -> None:
    page.goto(server.url + "/")
    page.locator("#about").filter(has_text="clips indexed").wait_for()
    page.evaluate("() => { document.getElementById('query').removeAttribute('maxlength'); }")
    page.fill("#query", "x" * 1001)
    page.press("#query", "Enter")
    page.locator("#error").wait_for(state="visible")
    assert "at most 1000 are taken" in page.locator("#error").inner_text()
    assert page.locator("#hits li").count() == 0
