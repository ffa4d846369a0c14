"""What all of chapter 7's checkers share: tensors as the 2-D views of their rows, and a hint
added to an error."""

from ...checking import ExerciseError


def _as_rows(t):
    """t (..., d) as the 2-D view of its rows where its strides allow: the same memory, and
    what the picture of an out-of-bounds access can draw (it draws 1-D and 2-D tensors)."""
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t


def _with_hint(error, hint):
    return ExerciseError(f"{error}\n  hint: {hint}") if hint else error
