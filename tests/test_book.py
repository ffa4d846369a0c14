"""The built book as a reader sees it: every page of _toc.yml opened in headless Chromium
with the network cut off (only file:// loads), so the math must be typeset by the MathJax
the book carries.

Needs Debian's chromium (``apt-get install chromium``; .ci/run installs it) and a built
book in _build/html (``make book`` builds it, then runs this file), and playwright; skips,
saying which is missing, otherwise. Playwright drives the system's chromium and downloads nothing.
A screenshot of chapter 3 is kept in _build/screenshots/.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

# The GPU run's hosts (scripts/gpu_run.sh) have no browser and no playwright: skip there too.
playwright_api = pytest.importorskip("playwright.sync_api", reason="the browser test of the book needs playwright "
                                                                  "(requirements.txt pins it)")
PlaywrightTimeoutError, sync_playwright = playwright_api.TimeoutError, playwright_api.sync_playwright

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
SCREENSHOT_OF = "student/03_layernorm"
CHROMIUM = shutil.which("chromium")
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="the browser test of the book needs Debian's chromium: "
                                                "apt-get install chromium"),
    pytest.mark.skipif(not (HTML / "index.html").exists(), reason=f"no built book in {HTML.relative_to(ROOT)}: "
                                                                  "make book builds it and runs this test"),
]


def toc_pages():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [chapter["file"] for part in toc["parts"] for chapter in part["chapters"]]


def notebook_cells(page_name):
    path = ROOT / f"{page_name}.ipynb"
    return json.loads(path.read_text())["cells"] if path.exists() else []


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    # No network: a page that needs a CDN shows here what a reader offline would see.
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
    page = context.new_page()
    yield page
    context.close()


# Text a reader sees that is still TeX source: delimiters MathJax should have consumed.
# Code blocks and MathJax's own output are left out.
RAW_TEX = """() => {
    const skip = "PRE, CODE, SCRIPT, STYLE, TEXTAREA, MJX-CONTAINER";
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const found = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        if (!node.parentElement.closest(skip) && /\\\\\\(|\\\\\\[|\\\\begin\\{/.test(node.textContent)) {
            found.push(node.textContent.trim().slice(0, 80));
        }
    }
    return found;
}"""
# Every image decoded: a missing or broken file rejects decode().
BROKEN_IMAGES = """() => Promise.all([...document.images].map(
    image => { image.loading = "eager"; return image.decode().then(() => null, () => image.getAttribute("src")); }
)).then(sources => sources.filter(source => source !== null))"""


def open_page(page, name):
    path = HTML / f"{name}.html"
    assert path.exists(), f"{path.relative_to(ROOT)} is missing, though _toc.yml lists {name}"
    page.goto(path.as_uri(), wait_until="load")
    if page.locator(".math").count():
        # MathJax typesets after the load event; its startup promise resolves when it is done.
        try:
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                   timeout=15_000)
        except PlaywrightTimeoutError:
            sources = page.evaluate("() => [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s))")
            pytest.fail(f"{name}: MathJax did not start offline within 15 s; the page loads it from {sources}")
        page.evaluate("() => MathJax.startup.promise")


@pytest.mark.parametrize("name", toc_pages())
def test_page_reads_offline(page, name):
    open_page(page, name)
    in_html = (HTML / f"{name}.html").read_text().count('class="math')
    math = page.locator(".math")
    assert math.count() == in_html, f"{name}: {in_html} math elements in the HTML, {math.count()} in the page"
    untypeset = page.locator(".math:not(:has(mjx-container))")
    assert untypeset.count() == 0, f"{name}: {untypeset.count()} of {in_html} math elements not typeset, " \
                                   f"the first: {untypeset.first.text_content()[:80]!r}"
    assert page.evaluate(RAW_TEX) == [], f"{name}: TeX source left in the text"
    assert page.evaluate(BROKEN_IMAGES) == [], f"{name}: images that did not load"
    plots = sum("image/png" in output.get("data", {}) for cell in notebook_cells(name) for output in cell.get("outputs", []))
    shown = page.locator(".cell_output img").count()
    assert shown == plots, f"{name}: the notebook stores {plots} plots, the page shows {shown}"
    if name == SCREENSHOT_OF:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / f"{Path(name).name}.png")


def test_every_glued_number_is_on_its_page():
    """A {glue:text} role whose value the stored outputs lack renders as its source or
    nothing: every role of a chapter's markdown becomes a pasted value on its page."""
    for name in toc_pages():
        cells = notebook_cells(name)
        roles = sum("".join(cell["source"]).count("{glue:text}") for cell in cells if cell["cell_type"] == "markdown")
        html = (HTML / f"{name}.html").read_text()
        assert "{glue" not in html, f"{name}: a glue role left unrendered"
        pasted = html.count('class="pasted-text"')
        assert pasted == roles, f"{name}: {roles} glue roles, {pasted} values pasted"


def test_the_book_has_math():
    """The offline check above passes trivially on pages without math; the book has plenty."""
    assert sum((HTML / f"{name}.html").read_text().count('class="math') for name in toc_pages()) > 100


def _answers(page_name):
    """The distinctive lines (over 20 characters) of each answer to a chapter's exercises,
    from the instructors' notebook (notebooks/<chapter>.ipynb) the page's student copy was made from."""
    source = ROOT / "notebooks" / f"{Path(page_name).name}.ipynb"
    answers = []
    for cell in json.loads(source.read_text())["cells"]:
        inside = False
        for line in "".join(cell["source"]).split("\n"):
            if line.strip() in ("# BEGIN SOLUTION", "# END SOLUTION"):
                inside = line.strip() == "# BEGIN SOLUTION"
                if inside:
                    answers.append([])
            elif inside and len(line.strip()) > 20:
                answers[-1].append(line.strip())
    return answers


@pytest.mark.parametrize("name", [name for name in toc_pages() if notebook_cells(name)])
def test_chapter_page_holds_no_answer_and_launches_the_student_copy(page, name):
    open_page(page, name)
    text = page.locator("main").inner_text()
    for answer in _answers(name):  # a line or two are idioms the chapter teaches; more gives the answer away
        shown = [line for line in answer if line in text]
        assert len(shown) <= len(answer) // 3, f"{name}: the page shows these lines of an answer: {shown}"
    assert "# YOUR CODE HERE" in text, f"{name}: the exercises' stubs are not on the page"
    owner_and_name = re.sub(r"^https://github\.com/", "", CONFIG["repository"]["url"])
    expected_link = (f"{CONFIG['launch_buttons']['colab_url']}/github/{owner_and_name}/blob/"
                     f"{CONFIG['repository']['branch']}/{name}.ipynb")
    assert name.startswith("student/"), f"{name}: a chapter page must be the student copy"
    links = page.locator('a[href^="https://colab.research.google.com/"]')
    assert [links.nth(i).get_attribute("href") for i in range(links.count())] == [expected_link], name
    solutions = page.locator('a[href*="solutions/"]')
    assert solutions.count() >= 1, f"{name}: no link to the chapter's solutions page"


@pytest.mark.parametrize("name", [name for name in toc_pages() if name.startswith("book/solutions/")])
def test_solutions_page_shows_every_answer(page, name):
    open_page(page, name)
    text = page.locator("main").inner_text()
    missing = [line for answer in _answers(name) for line in answer if line not in text]
    assert missing == [], f"{name}: answer lines missing from the solutions page: {missing[:3]}"
