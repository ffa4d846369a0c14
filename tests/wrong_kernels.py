"""Exercise kernels that reach outside their tensors, made from the notebooks' own solutions
by the edit that is the mistake (tests/teaching/exercises/solutions.py).

Run as a script, ``python tests/wrong_kernels.py CASE SEED`` runs the checker of CASE's
exercise on CASE's kernel in a process of its own (a kernel writing outside its tensors must
not take the test runner down) and prints the checker's ExerciseError.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "teaching" / "exercises"))

import course_lib  # noqa: E402,F401  (chooses the interpreter before triton is imported)
import torch  # noqa: E402

from course_lib.teaching import exercises  # noqa: E402
from course_lib.teaching.checking import ExerciseError  # noqa: E402
from solutions import solution  # noqa: E402

# case -> (notebook, exercise, kernel, checker, the edit that makes the mistake)
OUT_OF_BOUNDS = {
    "1.1 cols <= n_cols": ("01_weighted_sum", "1.1", "scale_columns_kernel", "check_scale_columns",
                           {"(cols < n_cols)[None, :]": "(cols <= n_cols)[None, :]"}),
    "1.1 no row mask": ("01_weighted_sum", "1.1", "scale_columns_kernel", "check_scale_columns",
                        {"mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]": "mask = (cols < n_cols)[None, :]"}),
    "1.1 n_cols as row stride": ("01_weighted_sum", "1.1", "scale_columns_kernel", "check_scale_columns",
                                 {"rows[:, None] * stride_x_row": "rows[:, None] * n_cols"}),
    "1.1 w indexed by rows": ("01_weighted_sum", "1.1", "scale_columns_kernel", "check_scale_columns",
                              {"w = tl.load(w_ptr + cols, mask=cols < n_cols)": "w = tl.load(w_ptr + rows, mask=rows < n_rows)",
                               "x * w[None, :]": "x * w[:, None]"}),
    "1.3 no row mask": ("01_weighted_sum", "1.3", "column_sum_kernel", "check_column_sum",
                        {"mask = (rows < n_rows)[:, None] & col_mask[None, :]": "mask = col_mask[None, :]"}),
    "2.1 rows <= n_rows": ("02_causal_softmax", "2.1", "softmax_rows_kernel", "check_softmax_rows",
                           {"mask = (rows < n_rows)[:, None]": "mask = (rows <= n_rows)[:, None]"}),
    "2.1 n_cols as row stride": ("02_causal_softmax", "2.1", "softmax_rows_kernel", "check_softmax_rows",
                                 {"rows[:, None] * stride_x_row": "rows[:, None] * n_cols"}),
    "4.2 cols <= n_cols": ("04_coordinate_descent", "4.2", "row_logsumexp_of_min_kernel", "check_row_logsumexp_of_min",
                           {"mask=cols < n_cols": "mask=cols <= n_cols"}),
}


def wrong_kernel(case):
    """CASE's kernel: its exercise's solution with the mistake's edit."""
    notebook, exercise, kernel, _, mistakes = OUT_OF_BOUNDS[case]
    return getattr(solution(notebook, exercise, mistakes), kernel)


if __name__ == "__main__":
    case = sys.argv[1]
    torch.manual_seed(int(sys.argv[2]))
    try:
        getattr(exercises, OUT_OF_BOUNDS[case][3])(wrong_kernel(case))
    except ExerciseError as error:
        print(f"ExerciseError: {error}")
    else:
        print("the checker passed")
