import pytest
import torch

from course_lib.teaching.checking import ExerciseError, compare, run_student_code


def test_right_answer_passes_and_returns_largest_error():
    expected = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    assert compare("a", expected.float() + 1e-7, expected, rtol=0, atol=1e-6) == pytest.approx(1e-7, rel=0.5)


def test_names_wrong_indices_and_values():
    expected = torch.zeros(4, 5, dtype=torch.float64)
    got = torch.zeros(4, 5)
    got[2, 4] = 3.0
    with pytest.raises(ExerciseError) as info:
        compare("answer", got, expected, rtol=0, atol=1e-3)
    message = str(info.value)
    assert "1 of 20 elements are wrong" in message
    assert "at (2, 4): got 3, expected 0" in message
    assert "only the last columns are wrong" in message


def test_nan_means_unwritten():
    with pytest.raises(ExerciseError, match="2 elements are NaN"):
        compare("y", torch.tensor([1.0, float("nan"), float("nan")]), torch.ones(3, dtype=torch.float64), rtol=0, atol=1)


def test_nan_expected_and_got_counts_as_right():
    both = torch.tensor([1.0, float("nan")])
    compare("y", both, both.double(), rtol=0, atol=0)


@pytest.mark.parametrize(
    "got, message",
    [(None, "got None"), ([1.0], "expected a torch.Tensor, got list"), (torch.ones(2), r"shape \(2,\), expected \(3,\)")],
)
def test_wrong_kind_of_answer(got, message):
    with pytest.raises(ExerciseError, match=message):
        compare("y", got, torch.ones(3, dtype=torch.float64), rtol=0, atol=0)


def test_crash_in_student_code_becomes_exercise_error():
    def broken(x):
        raise IndexError("index 7 is out of bounds")

    with pytest.raises(ExerciseError, match="your code raised IndexError: index 7 is out of bounds"):
        run_student_code("Exercise 9.9", broken, 1)


def _message(got, expected, **options):
    with pytest.raises(ExerciseError) as info:
        compare("y", got, expected, rtol=0, atol=1e-3, **options)
    return str(info.value)


@pytest.mark.parametrize("wrong_at", [(2, 49), (slice(1, 3), slice(45, 50))])
def test_never_says_only_the_last_columns_beside_only_the_last_rows(wrong_at):
    expected = torch.zeros(3, 50, dtype=torch.float64)
    got = torch.zeros(3, 50)
    got[wrong_at] = 1.0
    message = _message(got, expected)
    assert not ("only the last columns" in message and "only the last rows" in message), message


def test_a_corner_is_named_as_a_corner_and_full_edges_as_edges():
    expected = torch.zeros(6, 8, dtype=torch.float64)
    got = torch.zeros(6, 8)
    got[4:, 6:] = 1.0
    assert "bottom-right corner" in _message(got, expected)
    got = torch.zeros(6, 8)
    got[:, 6:] = 1.0
    assert "only the last columns are wrong" in _message(got, expected)
    got = torch.zeros(6, 8)
    got[4:, :] = 1.0
    assert "only the last rows are wrong" in _message(got, expected)


def test_the_stride_hint_names_the_strides_it_is_given():
    expected = torch.zeros(4, 5, dtype=torch.float64)
    got = torch.zeros(4, 5)
    got[:, 1:] = 1.0
    message = _message(got, expected, strides=("stride_grad_y_row", "stride_grad_y_col"))
    assert "(stride_grad_y_col)" in message and "stride_x_col" not in message


def test_the_picture_is_mentioned_only_when_one_was_shown(monkeypatch):
    from course_lib.teaching import checking

    expected = torch.zeros(4, 5, dtype=torch.float64)
    got = torch.ones(4, 5)
    monkeypatch.setattr(checking, "shows_pictures", lambda: False)
    assert "picture above" not in _message(got, expected, show_picture=True)
    drawn = []
    monkeypatch.setattr(checking, "shows_pictures", lambda: True)
    monkeypatch.setattr("matplotlib.pyplot.show", lambda: drawn.append(True))
    assert "picture above" in _message(got, expected, show_picture=True) and drawn
    import matplotlib.pyplot as plt
    plt.close("all")


def test_a_crash_is_told_in_the_exercise_s_words():
    def broken(x):
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")

    words = (("does not require grad", "the checker calls your answer under torch.no_grad()"),)
    with pytest.raises(ExerciseError, match="(?s)raised RuntimeError: element 0.*hint: the checker calls your answer"):
        run_student_code("Exercise 9.9", broken, 1, explain=words)
    with pytest.raises(ExerciseError, match="(?s)raised RuntimeError.*hint: said by a function"):
        run_student_code("Exercise 9.9", broken, 1, explain=lambda error: "said by a function")


@pytest.mark.parametrize("answer", [
    lambda x: x / max(x.abs().max(), 1.0),  # Python's max: bool() of a tensor
    lambda x: x / x.abs().max().item(),
    lambda x: x * len(x.tolist()),
])
def test_reads_of_tensor_values_into_python_are_refused(answer):
    from course_lib.teaching.checking import HOST_SYNC, refusing_host_syncs

    with refusing_host_syncs(), pytest.raises(ExerciseError, match="hint: the answer must stay in tensor operations"):
        run_student_code("Exercise 9.9", answer, torch.randn(3, 4), explain=HOST_SYNC)
    with refusing_host_syncs():
        run_student_code("Exercise 9.9", lambda x: x / x.abs().max().clamp(min=1.0), torch.randn(3, 4))
