import triton
import triton.language as tl

from course_lib import references
from course_lib.notebook import show_source, source_of
from course_lib.weighted_sum import weighted_sum_forward_kernel


def test_source_of_plain_function():
    assert source_of(references.weighted_sum).startswith("def weighted_sum(x, weight):")


def test_source_of_triton_kernel_in_either_runtime():
    assert "@triton.jit" in source_of(weighted_sum_forward_kernel)
    assert "def weighted_sum_forward_kernel(" in source_of(weighted_sum_forward_kernel)


def test_show_source_prints_each(capsys):
    @triton.jit
    def tiny_kernel(x_ptr, BLOCK: tl.constexpr):
        pass

    show_source(references.weighted_sum, tiny_kernel)
    out = capsys.readouterr().out
    assert "def weighted_sum(" in out and "def tiny_kernel(" in out
