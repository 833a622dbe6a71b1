"""`hf-ext serve` end to end in a real headless browser: Playwright for Python driving Debian's chromium
(`apt-get install chromium`; Playwright's own browser download is not possible on the project's machine). Each app
is used as a person would, what the page shows is checked against the library, and the page may reach nothing but
the app's own address. Under CI=true a missing chromium or Playwright fails the test instead of skipping it."""

import contextlib
import os
from pathlib import Path

import pytest
from conftest import missing_dependency, require_extra, running_app

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
# a closed network refuses chromium's background connections (updates, sync, QUIC probes): keep it from trying
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def browser():
    require_extra("test-slow", "playwright")
    from playwright import sync_api

    if not os.access(CHROMIUM, os.X_OK):
        missing_dependency(f"this test needs {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh page; every request it makes must go to the app (127.0.0.1) or stay inside the page."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    elsewhere = []
    page.on("request", lambda request: None if request.url.startswith(("http://127.0.0.1:", "data:", "blob:"))
            else elsewhere.append(request.url))
    yield page
    context.close()
    assert elsewhere == []


@contextlib.contextmanager
def opened_app(page, folder):
    """The app of `folder` running and open in `page`, once gradio has mounted every component: it loads their
    modules after the page, and a value set before the last one has loaded is reset to the initial one (seen with
    gradio 6.17 on a busy machine: the slider went back to 0.5). Gradio runs the app's load event after the mount."""
    with running_app(folder, page_load_js="() => { document.body.dataset.appMounted = 'true'; }") as url:
        page.goto(url)
        page.wait_for_function("document.body.dataset.appMounted === 'true'")
        yield


def screenshot(page, name, tmp_path):
    """The page as a PNG: in $HF_EXT_SCREENSHOTS when set (docs/images/serve_<model>.png come from there), else in
    the test's folder."""
    folder = Path(os.environ.get("HF_EXT_SCREENSHOTS") or tmp_path)
    page.screenshot(path=str(folder / f"serve_{name}.png"), full_page=True)


def textbox(page, elem_id):
    return page.locator(f"#{elem_id}").get_by_role("textbox")


def wait_for_value(page, elem_id):
    """The value of the textbox `elem_id` once the app has written one."""
    page.wait_for_function("id => document.querySelector(`#${id} textarea, #${id} input`)?.value", arg=elem_id)
    return textbox(page, elem_id).input_value()


def test_optimus_interpolation_follows_the_slider(page, optimus_sample_folder, tmp_path):
    from hf_ext.models.optimus import OptimusLatentSpace
    from hf_ext.models.optimus.app import MAX_NEW_TOKENS

    space = OptimusLatentSpace.from_pretrained(optimus_sample_folder, max_new_tokens=MAX_NEW_TOKENS)
    start, end = "a man is playing a guitar .", "a woman is reading a book ."
    with opened_app(page, optimus_sample_folder):
        textbox(page, "start").fill(start)
        textbox(page, "end").fill(end)
        page.locator("#t input[type=range]").fill("0.75")
        assert wait_for_value(page, "at_t") == space.interpolate_at(start, end, 0.75)
        page.get_by_role("button", name="Interpolate", exact=True).click()
        last = space.interpolate(start, end, 5)[-1][1]
        page.locator("#path").get_by_text(last, exact=True).first.wait_for()
        page.locator("#latent_map img").wait_for()  # the map of the two sentences with the path
        textbox(page, "start").fill("")
        page.locator("#t input[type=range]").fill("0.5")
        page.get_by_text("the first sentence is empty").wait_for()  # a message in the page, not a traceback
        assert "Traceback" not in page.content()
        textbox(page, "start").fill(start)
        page.locator("#t input[type=range]").fill("0.25")
        page.wait_for_function("value => document.querySelector('#at_t textarea, #at_t input').value === value",
                               arg=space.interpolate_at(start, end, 0.25))
        screenshot(page, "optimus", tmp_path)


def test_universal_transformer_halting_map(page, algorithmic_seq2seq_folder, tmp_path):
    from hf_ext.models.universal_transformer.app import UniversalTransformerApp
    from hf_ext.models.universal_transformer.loading import load_model_and_tokenizer

    expected, _ = UniversalTransformerApp(*load_model_and_tokenizer(str(algorithmic_seq2seq_folder))
                                          ).halting_map("31415", 0)
    with opened_app(page, algorithmic_seq2seq_folder):
        textbox(page, "input").fill("31415")
        page.get_by_role("button", name="Halting map", exact=True).click()
        assert wait_for_value(page, "output") == expected
        page.locator("#heatmap img").wait_for()
        page.wait_for_function("document.querySelector('#ponder_time').innerText.includes('</s>')")
        screenshot(page, "universal_transformer", tmp_path)


def test_mtdnn_shows_every_head(page, mtdnn_sample_folder, tmp_path):
    from hf_ext.models.mtdnn.app import MTDNNApp

    with opened_app(page, mtdnn_sample_folder):
        textbox(page, "sentence").fill("a man is playing .")
        textbox(page, "second_sentence").fill("a woman is sleeping .")
        page.get_by_role("button", name="Predict", exact=True).click()
        from transformers import AutoModel, AutoTokenizer

        app = MTDNNApp(AutoModel.from_pretrained(mtdnn_sample_folder),
                       AutoTokenizer.from_pretrained(mtdnn_sample_folder))
        predictions = app.predict("a man is playing .", "a woman is sleeping .")
        for task in ("sst", "nli"):
            page.locator(f"#task_{task}").get_by_text(predictions[task]["label"]).first.wait_for()
        page.locator("#task_sts").get_by_text(f"regression score {predictions['sts']['score']:.4f}").wait_for()
        screenshot(page, "mtdnn", tmp_path)
