"""The rules every chapter keeps, read from the notebooks and their stored GPU outputs:
measurements in the prose come from computation (glued or printed), never typed by hand;
printed library source stays a small part of what a chapter shows; the main path stays
short enough to read, with detours in optional sections at the end."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from course_lib.teaching.notebook import GLUE_MIME_PREFIX

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_SOURCE_SHARE = 0.25       # printed library source, of a chapter's text output
MAX_OUTPUT_LINES = 60         # text lines one cell shows
MAX_LINE = 88                 # characters a line of code or output may hold: the book's column
MAX_MAIN_PATH_WORDS = 3600    # "about 3500": markdown words before the optional sections
OPTIONAL_HEADING = re.compile(r"^##\s+Optional\b", re.M)
SOURCE_PRINTERS = ("show_source(", "show_section(", "show_excerpt(", "getsource(", "print(source_of(")

# What a measurement looks like in prose: a number with a unit of time, bandwidth, memory,
# a percentage, a speed-up ("1.3×"), or a bare decimal (a fraction of a copy, a loss).
MEASUREMENT = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s*(?:µs|us|ms|ns|s|seconds?|microseconds?|milliseconds?)\b"
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?\s*(?:[GTMK]i?B(?:/s)?|TFLOP/?s?|GFLOP/?s?)\b"
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?\s*%"
    r"|(?<![\w.])\d+(?:\.\d+)?\s*(?:[×x](?!\s*\d)(?![\w])|times\b)"
    r"|(?<![\w.])\d*\.\d+(?![\w.])"
)
# Versions, releases and the numbers of exercises and sections are not measurements.
NOT_MEASURED = re.compile(r"(Triton|torch|PyTorch|NumPy|CUDA|capability|version|colt5-attention|Python|"
                          r"jupyter-book|sphinx|nbval|sm_|release|exercises?|chapters?|sections?|hint)"
                          r"\s*(\S+\s*){0,2}$", re.I)


def cells(path):
    return json.loads(path.read_text())["cells"]


def source(cell):
    return "".join(cell["source"])


def prose_without_code_or_math(text):
    """Markdown with what may hold numbers legitimately taken out: code spans and blocks,
    math, glue roles, links' targets, HTML tags."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$]*\$", " ", text)
    text = re.sub(r"\{glue(:\w+)?\}`[^`]*`", " GLUED ", text)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<[^>]+>", " ", text)
    return text


def hand_typed_measurements(text):
    prose = prose_without_code_or_math(text)
    found = []
    for match in MEASUREMENT.finditer(prose):
        before = prose[max(0, match.start() - 40):match.start()]
        if NOT_MEASURED.search(before):
            continue
        found.append(prose[max(0, match.start() - 30):match.end() + 10].replace("\n", " "))
    return found


def main_path(path):
    """The markdown cells before the first optional section."""
    main = []
    for cell in cells(path):
        if cell["cell_type"] == "markdown" and OPTIONAL_HEADING.search(source(cell)):
            break
        if cell["cell_type"] == "markdown":
            main.append(source(cell))
    return main


def text_of(output):
    if output.get("output_type") == "stream":
        return "".join(output["text"])
    data = output.get("data", {})
    for mime in ("text/markdown", "text/plain"):
        if mime in data:
            return "".join(data[mime])
    return ""


def glued_names(cell):
    return [o.get("metadata", {}).get("scrapbook", {}).get("name") for o in cell.get("outputs", [])
            if "scrapbook" in o.get("metadata", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_measurement_is_typed_into_the_prose(path):
    typed = {i: hand_typed_measurements(source(c)) for i, c in enumerate(cells(path)) if c["cell_type"] == "markdown"}
    typed = {i: found for i, found in typed.items() if found}
    assert not typed, (f"{path.name}: numbers that read as measurements are typed into the markdown; glue them "
                       f"(course_lib.teaching.notebook.glue) or let a cell print them: {typed}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_glued_name_quoted_in_the_prose_is_stored(path):
    stored = [name for c in cells(path) if c["cell_type"] == "code" for name in glued_names(c)]
    assert len(stored) == len(set(stored)), f"{path.name} glues a name twice: {sorted(stored)}"
    quoted = {m.group(2) for c in cells(path) if c["cell_type"] == "markdown"
              for m in re.finditer(r"\{glue(:\w+)?\}`([^`:]+)(:[^`]*)?`", source(c))}
    missing = quoted - set(stored)
    assert not missing, f"{path.name} quotes glued values its stored outputs do not hold: {sorted(missing)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_glued_measurements_are_left_out_of_nbval(path):
    """A glued value measured on the GPU differs under the interpreter: its cell's output
    must be one nbval does not compare."""
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] == "code" and glued_names(cell):
            assert "nbval-ignore-output" in cell["metadata"].get("tags", []), (
                f"{path.name} cell {i} glues {glued_names(cell)} without the nbval-ignore-output tag")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_printed_source_is_a_small_part_of_the_output(path):
    total = printed = 0
    for cell in cells(path):
        if cell["cell_type"] != "code":
            continue
        shown = sum(len(text_of(o)) for o in cell.get("outputs", []))
        total += shown
        if any(printer in source(cell) for printer in SOURCE_PRINTERS):
            printed += shown
    assert total, f"{path.name} has no stored outputs"
    assert printed <= MAX_SOURCE_SHARE * total, (
        f"{path.name}: printed source is {printed / total:.0%} of the text output (at most {MAX_SOURCE_SHARE:.0%})")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_cell_shows_a_wall_of_text(path):
    for i, cell in enumerate(cells(path)):
        lines = sum(text_of(o).count("\n") for o in cell.get("outputs", []))
        assert lines <= MAX_OUTPUT_LINES, (
            f"{path.name} cell {i} shows {lines} lines (at most {MAX_OUTPUT_LINES}): an excerpt, a plot "
            "or the few rows the prose discusses instead")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_code_and_printed_lines_fit_the_books_column(path):
    """The book's code column holds about 88 characters: a longer line scrolls sideways."""
    long = []
    for i, cell in enumerate(cells(path)):
        texts = [("code", source(cell))] if cell["cell_type"] == "code" else []
        texts += [("output", text_of(o)) for o in cell.get("outputs", [])
                  if not any(k.startswith(GLUE_MIME_PREFIX) for k in o.get("data", {}))]
        long += [f"cell {i} {kind}: {line[:60]}… ({len(line)})" for kind, text in texts
                 for line in text.splitlines() if len(line) > MAX_LINE]
    assert not long, f"{path.name}: {len(long)} lines over {MAX_LINE} characters:\n" + "\n".join(long[:20])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_stored_output_is_an_error(path):
    errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue', '')[:200]}" for i, cell in enumerate(cells(path))
              for o in cell.get("outputs", []) if o["output_type"] == "error" or "Traceback" in text_of(o)]
    assert not errors, f"{path.name} stores errors: {errors}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_main_path_is_short_and_detours_come_last(path):
    words = sum(len(text.split()) for text in main_path(path))
    assert words <= MAX_MAIN_PATH_WORDS, (
        f"{path.name}: {words} words of markdown before its optional sections (at most about "
        f"{MAX_MAIN_PATH_WORDS}); move detours under a '## Optional: ...' heading at the end")
    after = False
    for cell in cells(path):
        if cell["cell_type"] != "markdown":
            continue
        text = source(cell)
        if OPTIONAL_HEADING.search(text):
            after = True
        elif after:
            assert not re.search(r"^##\s", text, re.M), (
                f"{path.name}: a main-path section follows an optional one: {text.splitlines()[0]!r}")


def test_the_measurement_rule_knows_a_measurement():
    assert hand_typed_measurements("a launch costs about 12 µs here")
    assert hand_typed_measurements("it reaches 0.93 of a copy")
    assert hand_typed_measurements("1.4× faster than eager")
    assert hand_typed_measurements("within 2% of each other")
    assert hand_typed_measurements("peak 1.11 GiB")
    assert hand_typed_measurements("it moves 1.5 times the bytes")
    assert not hand_typed_measurements("a 10 × 7 input cut into 4 × 4 tiles")
    assert not hand_typed_measurements("Triton 3.9 removed them; `tl.sum(x, 0.5)`; $\\varepsilon = 0.03$")
    assert not hand_typed_measurements("### Exercise 2.3: rows longer than a tile; see Exercise 1.1")
    assert not hand_typed_measurements("it runs {glue:text}`launch_us:.1f` µs")



# What a fresh Colab runtime has before a chapter's first cell runs (it never reinstalls them).
COLAB_PREINSTALLED = {"torch", "triton", "numpy", "matplotlib", "IPython", "PIL", "pandas", "scipy"}


def guarded_imports(tree):
    """Top-level module names imported inside a try whose handlers catch a missing module."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                handler.type is None or "ImportError" in ast.unparse(handler.type)
                or "ModuleNotFoundError" in ast.unparse(handler.type) for handler in node.handlers):
            for inner in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                guarded |= imported_top_level(inner)
    return guarded


def imported_top_level(node):
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom) and not node.level:
        return {node.module.split(".")[0]}
    return set()


@pytest.mark.parametrize("path", sorted((ROOT / "student").glob("*.ipynb")), ids=lambda path: path.stem)
def test_the_first_cell_installs_what_the_chapter_imports(path):
    """On a fresh Colab runtime a chapter runs to its end: every module it imports is in
    Python, preinstalled there, installed by its first cell (course_lib with its dependencies, or
    a package the cell installs when missing), or imported under a guard that says what to install."""
    import tomllib

    code = [source(c) for c in cells(path) if c["cell_type"] == "code"]
    install = ast.parse(code[0])
    checked = {node.args[0].value for node in ast.walk(install) if isinstance(node, ast.Call)
               and ast.unparse(node.func).endswith("find_spec") and isinstance(node.args[0], ast.Constant)}
    assert "course_lib" in checked, f"{path.name}'s first cell does not install course_lib when it is missing"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with_course_lib = {re.split(r"[<>=!;\[ ]", d)[0].replace("-", "_") for d in project["dependencies"]}
    available = set(sys.stdlib_module_names) | COLAB_PREINSTALLED | checked | with_course_lib
    missing = {}
    for index, text in enumerate(code[1:], start=1):
        tree = ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))
        guarded = guarded_imports(tree)
        for node in ast.walk(tree):
            for module in imported_top_level(node) - available - guarded:
                missing.setdefault(module, index)
    assert not missing, (f"{path.name} imports modules a fresh Colab runtime lacks, neither installed by its "
                         f"first cell nor guarded (module: code cell): {missing}")
