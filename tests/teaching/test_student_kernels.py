import pytest
import torch
import triton
from triton.runtime.jit import JITFunction

import kernels_for_student_tests as kernels
from course_lib.core.runtime import DEVICE, ON_GPU
from course_lib.teaching import student_kernels
from course_lib.teaching.checking import ExerciseError


def launch_double(kernel, x):
    out = torch.full_like(x, float("nan"))
    kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
    return out


def as_compiled(kernel):
    """The kernel as ``@triton.jit`` makes it on a GPU (a JITFunction around its Python function),
    so that the interpreter-first path is tested on a CPU too."""
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


@pytest.mark.parametrize("answer, message", [
    (lambda x: x * 2, r"pass the kernel itself.*got a function \(<lambda>\)"),
    (None, "got None"),
    (torch.zeros(3), "got a Tensor"),
])
def test_require_kernel_names_what_arrived(answer, message):
    with pytest.raises(ExerciseError, match=message):
        student_kernels.require_kernel("Exercise 9.9 (double)", answer, "double_kernel")


def test_require_kernel_refuses_autotuned_kernels():
    tuned = triton.autotune(configs=[triton.Config({})], key=["n"])(kernels.double_kernel)
    with pytest.raises(ExerciseError, match="@triton.jit alone"):
        student_kernels.require_kernel("Exercise 9.9 (double)", tuned, "double_kernel")


@pytest.mark.parametrize("kernel", [kernels.double_kernel, as_compiled(kernels.double_kernel)],
                         ids=["as decorated here", "as a GPU's JITFunction"])
def test_kernel_runs_interprets_first_with_helpers(kernel):
    x = torch.randn(37, device=DEVICE)
    runs = list(student_kernels.kernel_runs("Exercise 9.9 (double)", launch_double, kernel, x))
    assert [how for how, _ in runs] == (["under the interpreter", "compiled on the GPU"] if ON_GPU else [""])
    for _, got in runs:
        torch.testing.assert_close(got, 2 * x)
    assert isinstance(kernels.doubled, JITFunction) or not ON_GPU  # the helper is put back


@pytest.mark.parametrize("kernel", [kernels.double_past_the_end_kernel, as_compiled(kernels.double_past_the_end_kernel)],
                         ids=["as decorated here", "as a GPU's JITFunction"])
def test_a_mask_one_past_the_end_is_named_before_any_compiled_run(kernel):
    x = torch.randn(37, device=DEVICE)
    with pytest.raises(ExerciseError, match="out of bounds"):
        list(student_kernels.kernel_runs("Exercise 9.9 (double)", launch_double, kernel, x))


def test_an_endless_loop_is_stopped_with_a_message():
    x = torch.randn(8, device=DEVICE)
    with pytest.raises(ExerciseError, match="loop never end"):
        student_kernels.run_interpreted("Exercise 9.9 (endless)", launch_double, kernels.endless_kernel, x, seconds=1)


def test_speed_feedback_says_why_there_is_none_without_a_gpu(capsys):
    if ON_GPU:
        x = torch.randn(1 << 24, device=DEVICE)
        out = torch.empty_like(x)
        fraction = student_kernels.report_speed(
            "Exercise 9.9 (double)", lambda: kernels.double_kernel[(triton.cdiv(x.numel(), 1024),)](
                x, out, x.numel(), BLOCK=1024), 8 * x.numel(), against=("torch", lambda: torch.mul(x, 2, out=out)))
        assert 0 < fraction < 2 and "torch reaches" in " ".join(capsys.readouterr().out.split())
    else:
        assert student_kernels.report_speed("Exercise 9.9 (double)", None, 0) is None
        assert "measured on a GPU only" in capsys.readouterr().out


def test_throughput_feedback_is_tflops_against_the_same_work(capsys):
    if ON_GPU:
        a = torch.randn(2048, 2048, device=DEVICE, dtype=torch.bfloat16)
        ratio = student_kernels.report_throughput("Exercise 9.9 (matmul)", lambda: a @ a, 2 * 2048 ** 3,
                                                  against=("torch.matmul", lambda: a @ a), advice="tile it")
        out = capsys.readouterr().out
        assert 0.5 < ratio < 2 and "TFLOP/s" in out and "torch.matmul reaches" in " ".join(out.split())
    else:
        assert student_kernels.report_throughput("Exercise 9.9 (matmul)", None, 0, against=("torch", None)) is None
        assert "measured on a GPU only" in capsys.readouterr().out


@pytest.mark.parametrize("kernel", [kernels.misspelt_kernel, as_compiled(kernels.misspelt_kernel)],
                         ids=["as decorated here", "as a GPU's JITFunction"])
def test_an_error_inside_a_kernel_names_its_line(kernel):
    with pytest.raises(ExerciseError, match=r"NameError.*ofsets.*\n  at line \d+ of misspelt_kernel: tl.store"):
        list(student_kernels.kernel_runs("Exercise 9.9 (double)", launch_double, kernel, torch.randn(8, device=DEVICE)))


def test_masked_lanes_loaded_without_other_are_nan_as_the_checkers_run_kernels():
    """On a GPU those lanes hold whatever memory held; the interpreter's 0 would hide the bug."""
    x = torch.ones(5, device=DEVICE)
    summed = student_kernels.run_interpreted("Exercise 9.9 (sum)", launch_double, kernels.sum_without_other_kernel, x)
    assert summed.isnan().all()
    plain = student_kernels.run_interpreted("Exercise 9.9 (sum)", launch_double, kernels.sum_without_other_kernel, x,
                                            undefined_as_nan=False)
    assert plain.tolist() == [5.0] * 5  # the interpreter's 0: only inside the checkers' runs are they NaN


def test_a_kernel_calling_triton_helpers_runs_interpreted_then_compiled():
    """tl.sum is a @jit function of triton.language: interpreted with the kernel, then put back,
    so that the compiled run (on a GPU) still compiles."""
    x = torch.randn(9, device=DEVICE)
    for _, got in student_kernels.kernel_runs("Exercise 9.9 (sum)", launch_double, kernels.sum_kernel, x):
        torch.testing.assert_close(got, x.sum().expand(9))


OPTIONS_KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def tripled(value):
    return value * 3


@triton.jit
def halved(value):
    return tripled(value) / 6


@triton.jit({options})
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(out_ptr + offsets, 4 * halved(x), mask=offsets < n)
'''


@pytest.mark.parametrize("options", ["do_not_specialize=[]", "debug=True", "do_not_specialize=['n']",
                                     "do_not_specialize=[2], noinline=False"])
def test_a_right_kernel_with_options_of_triton_jit_and_helpers_passes(options, tmp_path):
    """`@triton.jit(do_not_specialize=[])` and other options, and @jit helpers calling helpers."""
    import importlib.util
    import sys

    path = tmp_path / f"options_kernel_{abs(hash(options))}.py"
    path.write_text(OPTIONS_KERNELS.replace("{options}", options))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    x = torch.randn(37, device=DEVICE)
    for kernel in (module.double_kernel, as_compiled(module.double_kernel)):
        assert student_kernels.require_kernel("Exercise 9.9 (double)", kernel, "double_kernel") is kernel
        for _, got in student_kernels.kernel_runs("Exercise 9.9 (double)", launch_double, kernel, x):
            torch.testing.assert_close(got, 2 * x)
