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
