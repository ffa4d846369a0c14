"""Small helpers the chapters' notebooks share."""

import inspect

import torch


def source_of(obj):
    """Source code of a function, class or Triton kernel (compiled or interpreted)."""
    # @triton.jit wraps the Python function in a JITFunction (GPU) or an
    # InterpretedFunction (interpreter); both keep it as `.fn`.
    return inspect.getsource(getattr(obj, "fn", obj))


def show_source(*objects):
    """Print the source of each object, as the book shows the finished kernels."""
    print("\n\n".join(source_of(obj).rstrip() for obj in objects))


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
    print(section_of(module, title))


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
    print(excerpt_of(obj, first, last))


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

    text = format(value, fmt) if fmt else str(value)
    display({GLUE_MIME_PREFIX + "text/plain": text}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_MIME_PREFIX}})


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
