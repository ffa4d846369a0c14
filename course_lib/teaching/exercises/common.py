"""What every chapter's checkers share: the hidden-size switch and random sizes.

The grader switches hidden sizes on in its own fresh copy of the package
(``fresh_checker.run_checker``, through :func:`set_hidden_sizes`): each checker then adds a
case of random size, drawn from the hidden seed, to the sizes a student saw, so that an
answer that works only at those sizes fails too.

Past the cases a student saw, :func:`beyond_cases_runs` runs a case again with the outputs
filled beforehand (:class:`Prefilled`): an answer that reads its output to decide what to
write is right only while the output starts as NaN.
"""

import dataclasses

import torch

from ..checking import ExerciseError, run_student_code
from ..notebook import fit_text
from ..student_kernels import kernel_runs

HIDDEN_SIZES = False


def set_hidden_sizes(on):
    """Whether checkers add a case of hidden size (the grader's fresh copy sets it)."""
    global HIDDEN_SIZES
    HIDDEN_SIZES = bool(on)


def hidden_case(draw):
    """[draw()] when grading with hidden sizes, else nothing."""
    return [draw()] if HIDDEN_SIZES else []


def random_size(low, high):
    """A random integer from low to high, from torch's generator (the hidden seed when grading)."""
    return int(torch.randint(low, high + 1, ()))


def random_matrix(max_rows, max_cols, dtype=torch.float64):
    return torch.randn(random_size(1, max_rows), random_size(2, max_cols), dtype=dtype)


def run_quietly(name, fn, *args):
    """run_student_code without the interpreter's RuntimeWarnings: a fully masked row
    past the end computes -inf - (-inf) in NumPy, which warns on a CPU and not on a
    GPU, though that row is never stored."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return run_student_code(name, fn, *args)


def without_mask_hints(error):
    """compare's hints about masks, dropped for answers written in PyTorch, which have none."""
    return "\n".join(line for line in str(error).split("\n") if "check the mask" not in line)


def without_layout_hints(error):
    """compare's hints about masks and strides, dropped for answers written in PyTorch, which
    index no memory themselves."""
    return "\n".join(line for line in without_mask_hints(error).split("\n")
                     if "whose address does not depend" not in line)


def matches(got, expected, rtol=1e-9, atol=1e-9):
    """got matches expected (a hint candidate), quietly: False for anything not comparable."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    return bool(torch.allclose(got.detach().to("cpu", torch.float64), expected.cpu(), rtol=rtol, atol=atol))


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise as the instructors' notes list it (each chapter module's ``EXERCISES``)."""

    number: str  # "N.M", as headed in the chapter
    title: str
    checker: str  # the check_... function
    kernel: bool  # whether the answer is a @triton.jit kernel
    skills: str
    difficulty: int  # 1 (a few lines, one idea) to 5 (a kernel of the course's own size)
    minutes: int  # what a student who has read the chapter needs


def say(message):
    """Print a checker's verdict wrapped to the book's column."""
    print(fit_text(message))


class Prefilled:
    """A launcher whose outputs start filled with random values like real ones (a fresh
    fill each call, so no two runs, interpreted and compiled, see the same), instead of the
    NaN a student's launch sees: an answer that writes only where the output holds NaN, or
    that reads its output to decide, fails. ``fills`` keeps each call's fills, to name it."""

    def __init__(self, launch, make_outputs):
        self.launch, self.make_outputs, self.fills = launch, make_outputs, []

    def __call__(self, kernel, *args, **kwargs):
        out = self.make_outputs(*args)
        self.fills.append(tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone())
        return self.launch(kernel, *args, out=out, **kwargs)

    def kept_fill(self, got, expected, rtol=1e-5, atol=1e-5):
        """Whether the wrong elements of ``got`` (one output) hold the last fill's values."""
        fill = self.fills[-1] if self.fills else None
        if isinstance(fill, tuple):
            fill = next((f for f in fill if f.shape == getattr(got, "shape", None)), None)
        if fill is None or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return False
        got64, fill64, expected64 = (t.detach().to("cpu", torch.float64) for t in (got, fill, expected))
        wrong = ~torch.isclose(got64, expected64, rtol=rtol, atol=atol, equal_nan=True)
        return bool(wrong.any() and torch.isclose(got64[wrong], fill64[wrong], rtol=0, atol=0).all())

    def kept_some_fill(self, got, expected, rtol=1e-5, atol=1e-5):
        """kept_fill for a launcher of one output or of several (a tuple, in the order of the
        fills, so that outputs of one shape are told apart): whether the wrong elements of one
        of them hold what it held before the launch."""
        if not isinstance(got, tuple):
            return self.kept_fill(got, expected, rtol, atol)
        if not self.fills or not isinstance(expected, tuple):
            return False

        def alone(fill):  # the same launcher, its last fill this output's only
            single = Prefilled(self.launch, self.make_outputs)
            single.fills.append(fill)
            return single

        return any(alone(fill).kept_fill(output, right, rtol, atol)
                   for fill, output, right in zip(self.fills[-1], got, expected))


KEPT_FILL_HINT = ("the wrong elements still hold what the output held before the launch (here random values, "
                  "not NaN): write every element of the output, whatever it holds; a kernel must not read its "
                  "output to decide what to write")


def random_fill(shape, device, dtype=torch.float32):
    """Values an output may hold before the launch, indistinguishable from real ones."""
    return torch.randn(shape, device=device, dtype=dtype)


# --------------------------------------------------------------- checks past the listed cases

BEYOND_CASES_HINT = ("this case lies past the cases listed above (more rows or columns than any of them, or "
                     "scores far from 0): the kernel must compute every element the same way whatever the size, "
                     "the program id or the values; does it branch on n_rows, n_cols or the program id, or start "
                     "a running value at a number that is not neutral?")


def beyond_cases_runs(name, what, launch, kernel, args, verify, fresh_out, hint=None):
    """A case checked after the printed ones (it does not change their line): run as
    kernel_runs does, outputs as the launcher makes them (NaN), then once more through
    :class:`Prefilled`, the outputs filled by ``fresh_out()`` (random values the kernel cannot
    tell from real ones). ``verify(label, got)`` raises ExerciseError when ``got`` is wrong;
    ``hint(got)`` may name the mistake of the first runs (else a hint about sizes is added)."""
    right = {}
    for how, got in kernel_runs(name, launch, kernel, *args):
        try:
            verify(f"{name}, {what}" + (f", {how}" if how else ""), got)
        except ExerciseError as error:
            named = hint(got) if hint else None
            raise ExerciseError(f"{without_mask_hints(error)}\n  hint: {named or BEYOND_CASES_HINT}") from None
        right[how] = got
    prefilled = Prefilled(launch, lambda *_: fresh_out())
    for how, got in kernel_runs(name, prefilled, kernel, *args):
        try:
            verify(f"{name}, {what}, outputs filled with random values before the launch (right when they start "
                   "as NaN)" + (f", {how}" if how else ""), got)
        except ExerciseError as error:
            # the run with NaN outputs was right, so right[how] tells the elements this run got wrong
            kept = prefilled.kept_some_fill(got, right[how])
            raise ExerciseError(without_mask_hints(error) + (f"\n  hint: {KEPT_FILL_HINT}" if kept else "")) from None
