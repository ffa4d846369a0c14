"""Small helpers the chapters' notebooks share."""

import inspect
import io
import re
import textwrap
import tokenize

import torch

from .observations import observe  # noqa: F401  (the chapters import it from here, beside claim)


# The book's code column holds about 88 characters; the package is written to 120. What a
# chapter prints of it is folded to the column (tests/test_chapters.py checks every line).
COLUMN = 88
_CLOSING = {")": "(", "]": "[", "}": "{"}


def _break_points(line, inside=False):
    """Where ``line`` may be broken and go on, indented, on the next line: after a comma or
    before an operator, inside brackets and outside strings (``inside``: the whole line is
    within a bracket opened on a line before). (index, bracket column) pairs."""
    indent = len(line) - len(line.lstrip())
    points, stack, quote = [], [indent] if inside else [], None
    i = 0
    while i < len(line):
        char = line[i]
        if quote:
            if char == "\\":
                i += 1
            elif line.startswith(quote, i):
                i += len(quote) - 1
                quote = None
        elif char == "#":
            break
        elif char in "\"'":
            quote = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else char
            i += len(quote) - 1
        elif char in "([{":
            stack.append(i + 1)
        elif char in ")]}" and stack:
            stack.pop()
        elif stack and char == "," and line[i + 1:i + 2] == " ":
            points.append((i + 2, stack[-1]))
        elif stack and char == " " and re.match(r" (and|or|if|else|for|[-+*/@|&]|//|\*\*) ", line[i:]):
            points.append((i + 1, stack[-1]))
        i += 1
    return points


def fit_line(line, width=COLUMN, inside=False):
    """One line of Python folded into lines of at most ``width`` characters where it can be:
    a long comment wrapped, a trailing comment moved above its code, a one-line docstring made
    a multi-line one, code broken inside brackets (where Python needs no backslash; an import
    list or a condition is bracketed first). A line it cannot fold comes back as it was."""
    if len(line) <= width:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    body = line.strip()
    if body.startswith("#"):
        return textwrap.wrap(body[1:].strip(), width - len(indent) - 2,
                             initial_indent=indent + "# ", subsequent_indent=indent + "# ") or [line]
    if not inside and re.fullmatch(r'[rbuf]?"""[^"]*"""', body):
        opening = body[: body.index('"""') + 3]
        words = textwrap.wrap(body[len(opening):-3], width - len(indent) - 3, break_on_hyphens=False)
        return [indent + opening + words[0]] + [indent + w for w in words[1:-1]] + [indent + words[-1] + '"""'] \
            if len(words) > 1 else [line]
    code, hash_, comment = line.partition("  # ")
    if hash_ and len(code) <= width:
        return fit_line(indent + "# " + comment, width, inside) + [code.rstrip()]
    fitting = [(at, column) for at, column in _break_points(line, inside)
               if len(indent) < at <= width and line[:at].strip()]
    if not fitting and not inside and _complete(body):
        bracketed = re.fullmatch(r"(from \S+ import |(?:if|elif|while|return|assert) )([^(#].*?)(:?)", body)
        if bracketed and "(" not in bracketed.group(2)[:1]:
            head, expression, colon = bracketed.groups()
            return fit_line(f"{indent}{head}({expression}){colon}", width)
    if not fitting:
        return [line]
    at, column = fitting[-1]
    rest_indent = " " * (column if column <= width // 2 else len(indent) + 8)
    if len(rest_indent) + len(line[at:].lstrip()) >= len(line):  # no shorter: leave it
        return [line]
    # the rest is inside the bracket the break was made in
    return [line[:at].rstrip()] + fit_line(rest_indent + line[at:].lstrip(), width, inside=True)


def _complete(code):
    """Whether ``code`` is a whole logical line: no bracket or string left open, no backslash."""
    try:
        list(tokenize.generate_tokens(io.StringIO(code + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    return not code.endswith("\\")


def fit_code(text, width=COLUMN):
    """Python source folded to the book's column, line by line (``fit_line``); the lines of a
    docstring or other multi-line string are wrapped as prose at their indentation."""
    in_string, open_at = set(), {}  # lines inside a string; brackets open where a line starts
    depth = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            open_at.setdefault(token.start[0], depth)
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                in_string.update(range(token.start[0] + 1, token.end[0] + 1))
            elif token.type == tokenize.OP and token.string in "([{":
                depth += 1
            elif token.type == tokenize.OP and token.string in ")]}":
                depth = max(0, depth - 1)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass  # an excerpt cut inside a bracket: the lines after the cut are folded as if outside
    folded = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in in_string and len(line) > width:
            indent = line[: len(line) - len(line.lstrip())]
            folded += textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent,
                                    break_on_hyphens=False) or [line]
        elif number not in in_string:
            folded += fit_line(line, width, inside=open_at.get(number, 0) > 0)
        else:
            folded.append(line)
    return "\n".join(folded)


def fit_text(text, width=COLUMN):
    """A message (an error, a checker's verdict) wrapped to the book's column, paragraph by line."""
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False, break_long_words=False) if line else ""
                     for line in text.splitlines())


def source_of(obj):
    """Source code of a function, class or Triton kernel (compiled or interpreted)."""
    # @triton.jit wraps the Python function in a JITFunction (GPU) or an
    # InterpretedFunction (interpreter); both keep it as `.fn`.
    return inspect.getsource(getattr(obj, "fn", obj))


def show_source(*objects):
    """Print the source of each object, as the book shows the finished kernels."""
    print(fit_code("\n\n".join(source_of(obj).rstrip() for obj in objects)))


def section_of(module, title):
    """The lines of one section of a course_lib module: from its ``# ---- title`` rule
    to the next rule (the modules read kernels, launchers, autograd, custom operator, public)."""
    lines = inspect.getsource(module).splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("# ---") and line.rstrip().endswith(f" {title}")]
    if not rules:
        raise ValueError(f"{module.__name__} has no section {title!r}")
    start = rules[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("# ---")), len(lines))
    return "\n".join(lines[start:end]).rstrip()


def show_section(module, title):
    """Print one section of a course_lib module, as the book shows a finished layer."""
    print(fit_code(section_of(module, title)))


def excerpt_of(obj, first, last=None):
    """The lines of ``obj``'s source from the first line containing ``first`` to the next
    line containing ``last`` (or to the end of that block when ``last`` is None: the lines
    indented deeper than the first one). Raises ValueError naming the marker that is missing,
    so a chapter whose excerpt drifted from the package fails instead of showing other code."""
    source = obj if isinstance(obj, str) else (
        inspect.getsource(obj) if inspect.ismodule(obj) else source_of(obj))
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if first in line), None)
    if start is None:
        raise ValueError(f"no line of {getattr(obj, '__name__', 'the source')} contains {first!r}")
    if last is None:
        indent = len(lines[start]) - len(lines[start].lstrip())
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        end -= 1
        while end > start and not lines[end].strip():
            end -= 1
    else:
        end = next((i for i in range(start + 1, len(lines)) if last in lines[i]), None)
        if end is None:
            raise ValueError(f"no line after {first!r} contains {last!r}")
    return "\n".join(lines[start:end + 1])


def show_excerpt(obj, first, last=None):
    """Print an excerpt of ``obj``'s source (see ``excerpt_of``): how the book shows what
    the package adds to a kernel without printing all of it."""
    print(fit_code(excerpt_of(obj, first, last)))


# MyST-NB reads a glued value from an output carrying this metadata; the MIME prefix hides
# the value from the cell's visible output (myst_nb.glue(..., display=False) writes the same).
GLUE_MIME_PREFIX = "application/papermill.record/"


def glue(name, value, fmt=None):
    """Make ``value`` quotable in the chapter's markdown as {glue:text}`name` (MyST-NB's
    glue, written without needing myst_nb installed). ``fmt`` (a format spec such as
    ".2f" or ".0%") decides how the number reads in the prose; the text is what the book
    shows, so a sentence quoting it changes when the measurement does. Returns nothing (a
    returned value would show as the cell's result when glue ends the cell)."""
    from IPython.display import display

    if isinstance(value, float) and not (fmt and fmt[-1] in "f%e"):
        # str(0.4) and the "g" formats drop trailing zeros: a table's 0.40 would read 0.4 in the prose
        raise ValueError(f"glue {name!r}: give a float a fixed-point format ('.2f', '.0%'), not {fmt!r}")
    text = format(value, fmt) if fmt else str(value)
    # Stored as a Python string literal: MyST-NB reads text/plain through literal_eval, which
    # turns an unquoted "0.40" into the float 0.4 and prints "0.4".
    display({GLUE_MIME_PREFIX + "text/plain": repr(text)}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_MIME_PREFIX}})


def glue_provenance(prefix, document):
    """Glue a results document's GPU, commit and day as ``<prefix>_gpu``, ``<prefix>_commit``
    and ``<prefix>_date``, so that a speed section names the run it quotes."""
    glue(f"{prefix}_gpu", document["gpu"])
    glue(f"{prefix}_commit", document.get("commit", "unknown"))
    glue(f"{prefix}_date", document.get("date", "unknown"))


class ClaimContradicted(AssertionError):
    """A sentence of the chapter that the data of this run contradicts."""


def claim(sentence, holds, evidence=""):
    """Check a comparison the chapter's prose makes against the data the chapter shows:
    raises ClaimContradicted quoting the sentence (and the evidence) when ``holds`` is false,
    so a GPU run that turns the comparison over fails instead of leaving a false sentence."""
    if not holds:
        raise ClaimContradicted(f"the chapter says {sentence!r}, but this run's data does not"
                                + (f": {evidence}" if evidence else ""))


def host_and_gpu_events(prof, step_name="step"):
    """From a torch.profiler run whose steps are marked record_function(step_name): the
    events of the last step, as (row, name, start_us, duration_us). Rows are the host
    threads that ran operators ("host thread 1", ...) and "GPU" for kernels and copies;
    only top-level host operators are kept (not the calls inside them)."""
    events = prof.events()
    steps = [e for e in events if e.name == step_name]
    if not steps:
        raise ValueError(f"the profile has no {step_name!r} ranges: mark each step with record_function")
    last = max(steps, key=lambda e: e.time_range.start)
    origin = last.time_range.start
    gpu = torch.autograd.DeviceType.CUDA
    inside = [e for e in events if e is not last and e.name != step_name and e.time_range.start >= origin]
    rows, threads, ends = [], {}, {}
    for e in sorted(inside, key=lambda e: e.time_range.start):
        if e.device_type == gpu:
            row = "GPU"
        else:
            if e.time_range.start < ends.get(e.thread, -1):  # inside an operator already listed
                continue
            ends[e.thread] = e.time_range.end
            row = threads.setdefault(e.thread, f"host thread {len(threads) + 1}")
        rows.append((row, e.name, e.time_range.start - origin, e.time_range.elapsed_us()))
    return rows


def draw_timeline(events, title=None, ax=None, label_wider_than=0.04):
    """Draw (row, name, start_us, duration_us) events as boxes, one line a row, names on
    boxes wide enough to hold them (a fraction ``label_wider_than`` of the time shown)."""
    import matplotlib.pyplot as plt

    row_names = list(dict.fromkeys(row for row, *_ in events))
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.7 + 0.55 * len(row_names)))
    span = max((start + duration for _, _, start, duration in events), default=1.0)
    colours = plt.cm.tab20.colors
    for row, name, start, duration in events:
        y = row_names.index(row)
        colour = colours[hash(name) % len(colours)]
        ax.barh(y, max(duration, span / 500), left=start, height=0.6, color=colour, edgecolor="black", linewidth=0.3)
        if duration > label_wider_than * span:
            ax.text(start + duration / 2, y, name.split("::")[-1][:28], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(row_names)), row_names)
    ax.invert_yaxis()
    ax.set_xlabel("µs from the start of the step")
    if title:
        ax.set_title(title)
    return ax
