from pathlib import Path

import os
import subprocess
import sys

import pytest
import torch

from course_lib.core import runtime  # before triton: it may select the interpreter
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from conftest import gpu_only  # noqa: E402


def test_describe_names_triton_and_where_kernels_run():
    text = runtime.describe()
    assert "Triton" in text
    assert ("CPU interpreter" in text) != runtime.ON_GPU


def test_device_matches_backend():
    assert runtime.DEVICE.type == ("cuda" if runtime.ON_GPU else "cpu")


def test_old_gpu_falls_back_to_the_interpreter_with_an_explanation(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.warns(UserWarning, match=r"Tesla T4 has compute capability 7.5.*needs 8.0 or newer"):
        use_gpu, reason = runtime._choose_backend()
    assert not use_gpu and "Tesla T4" in reason


def test_no_gpu_and_forced_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime._choose_backend() == (False, "no CUDA GPU was found")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert runtime._choose_backend() == (False, "TRITON_INTERPRET=1 is set")


def test_supported_gpu_is_used(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100")
    assert runtime._choose_backend() == (True, "NVIDIA H100")



def test_host_integer_helpers_agree_with_triton():
    # The launchers' own copies, fast on the host; triton's are the reference.
    import triton

    for n in [0, 1, 2, 3, 4, 5, 7, 8, 9, 1000, 1023, 1024, 1025, 2**31 - 1, 2**31, 2**40 + 3]:
        assert runtime.next_power_of_2(n) == triton.next_power_of_2(n), n
        for block in [1, 2, 3, 16, 1000, 2**31]:
            assert runtime.cdiv(n, block) == triton.cdiv(n, block), (n, block)


def test_pick():
    assert runtime.pick(gpu="big", cpu="small") == ("big" if runtime.ON_GPU else "small")


IMPORT_ORDERS = ["import torch._dynamo; import course_lib", "import triton.language as tl; import course_lib",
                 "import course_lib; import torch._dynamo", "import course_lib"]


def run_fresh(code, timeout=300, interpret=False):
    """``code`` in a new Python process, with TRITON_INTERPRET=1 only if ``interpret``; fails the
    test with its stderr, else returns its stdout."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if interpret:
        environment["TRITON_INTERPRET"] = "1"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# What course_lib could change in triton and torch: triton.language's @jit helpers, the
# interpreter's operations, torch.library.wrap_triton, Triton's allocator and the environment.
STATE = """
import os, sys, triton, triton.language, torch
from triton.runtime.interpreter import InterpreterBuilder
def state():
    modules = [m for n, m in sorted(sys.modules.items()) if n.startswith("triton") and m is not None]
    return ({(m.__name__, k): id(v) for m in modules for k, v in list(vars(m).items())},
            dict(vars(InterpreterBuilder)), torch.library.wrap_triton, dict(os.environ),
            triton.knobs.runtime.interpret)
"""


@pytest.mark.parametrize("first", ["import triton.language", "import torch._dynamo"])
def test_importing_course_lib_changes_nothing_in_triton_or_torch(first):
    run_fresh(f"""{first}
{STATE}
before = state()
import course_lib, course_lib.teaching, course_lib.registry
after = state()
assert before[1:] == after[1:], "the interpreter, wrap_triton, the environment or Triton's knobs changed"
changed = [key for key, value in before[0].items() if after[0].get(key) != value]
assert not changed, changed
""")


@pytest.mark.skipif(runtime.ON_GPU, reason="on a GPU the kernels are compiled; use_interpreter changes nothing")
def test_use_interpreter_runs_the_kernels_and_its_undo_puts_everything_back():
    run_fresh(f"""import torch._dynamo
{STATE}
before = state()
import course_lib
from course_lib.core import runtime
launches = []
launch = runtime.launch
def counted(kernel, *args, **kwargs):
    launches.append(kernel)
    return launch(kernel, *args, **kwargs)
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("course_lib.kernels") and hasattr(module, "launch"):
        module.launch = counted
x, g = torch.randn(3, 37), torch.randn(37)
course_lib.softmax(x)
assert not launches and not runtime.interpreting(), "CPU tensors take the references until use_interpreter"
assert runtime.use_interpreter() and runtime.interpreting()
assert "CPU interpreter" in runtime.describe()
assert torch.allclose(course_lib.softmax(x), torch.softmax(x, -1), atol=1e-6)
assert torch.allclose(course_lib.layernorm(x, g), torch.nn.functional.layer_norm(x, (37,), g), atol=1e-5)
assert len(launches) == 2, launches
runtime.stop_interpreter()
assert not runtime.interpreting()
after = state()
assert before[1:] == after[1:]
changed = [key for key, value in before[0].items() if after[0].get(key) != value]
assert not changed, changed
course_lib.softmax(x)
assert len(launches) == 2, "after stop_interpreter CPU tensors take the references again"
""")


@pytest.mark.skipif(runtime.ON_GPU, reason="the order matters only where the interpreter runs the kernels")
@pytest.mark.parametrize("imports", IMPORT_ORDERS)
def test_any_import_order_works_with_the_interpreter(imports):
    """torch.compile imports triton before course_lib; use_interpreter makes triton's own
    @jit helpers (tl.max, tl.sum), built then, interpreted too."""
    run_fresh(f"""{imports}
import torch, course_lib
assert course_lib.runtime.use_interpreter()
x = torch.randn(3, 37)
assert torch.allclose(course_lib.softmax(x), torch.softmax(x, -1), atol=1e-6)
g = torch.randn(37)
assert torch.allclose(course_lib.layernorm(x, g), torch.nn.functional.layer_norm(x, (37,), g), atol=1e-5)
""")


def _interpreter_runs_here():
    import numpy

    try:
        runtime._check_interpreter_numpy(triton.__version__, numpy.__version__)
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _interpreter_runs_here(), reason="this Triton's interpreter refuses this numpy")
def test_the_interpreter_asked_for_in_the_environment_is_on_at_import():
    code = "import course_lib; assert course_lib.runtime.interpreting(); print(course_lib.runtime.describe())"
    assert "CPU interpreter" in run_fresh(code, interpret=True)


@triton.jit
def _scaled_copy_kernel(src_ptr, dst_ptr, n, scale, BLOCK: tl.constexpr, ADD_ONE: tl.constexpr = False):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    values = tl.load(src_ptr + offsets, mask=mask) * scale
    if ADD_ONE:
        values += 1
    tl.store(dst_ptr + offsets, values, mask=mask)


@pytest.mark.parametrize("triton_version, numpy_version, refused", [
    ("3.6.0", "2.4.6", True), ("3.5.1", "2.5.0", True), ("3.6.0", "2.3.5", False),
    ("3.7.1", "2.4.6", False), ("3.9.0", "2.5.2", False),
])
def test_interpreter_refuses_numpy_its_triton_cannot_run_with(triton_version, numpy_version, refused):
    if refused:
        with pytest.raises(ImportError, match=rf"Triton {triton_version}'s CPU interpreter does not work with "
                                              rf"numpy {numpy_version}; install numpy<2.4"):
            runtime._check_interpreter_numpy(triton_version, numpy_version)
    else:
        runtime._check_interpreter_numpy(triton_version, numpy_version)


def test_signature_tells_apart_what_triton_compiles_for():
    """Every fact Triton specialises a kernel on changes launch's key: dtypes, 16-byte
    alignment, integers equal to 1, multiples of 16, beyond 32 bits."""
    x = torch.zeros(64, device=runtime.DEVICE)

    def key(*args):
        return runtime._signature(args)

    assert key(x) != key(x[1:]) and key(x) == key(x[4:])  # 4 floats = 16 bytes
    assert key(x) != key(x.half())
    assert len({key(1), key(16), key(17), key(2**31 + 16)}) == 4
    assert key(True) != key(1) and key(None) != key(0) and key(1.0) != key(1)
    assert key(x, 3, None) == key(x[4:], 3, None)


@pytest.mark.skipif(not hasattr(runtime.TensorDescriptor, "from_tensor"), reason="this Triton has no descriptors")
def test_signature_keys_a_descriptor_by_what_triton_compiles_it_for():
    """A host-side TensorDescriptor specialises a kernel on its dtype, block shape and
    padding; its shape and strides Triton turns into a TMA descriptor at every launch."""
    def key(tensor, block_shape):
        return runtime._signature([runtime.TensorDescriptor.from_tensor(tensor, block_shape)])

    rows = torch.zeros(64, 32, device=runtime.DEVICE)
    assert key(rows, [16, 16]) == key(torch.zeros(128, 64, device=runtime.DEVICE), [16, 16])
    assert key(rows, [16, 16]) != key(rows, [32, 16])
    assert key(rows, [16, 16]) != key(rows.half(), [16, 16])


@pytest.mark.parametrize("offset", [0, 1, 4], ids=["aligned", "misaligned", "aligned_again"])
def test_launch_gives_what_kernel_grid_gives(offset):
    """Launched twice (on a GPU the second time directly, past kernel[grid]), on aligned
    and misaligned views, with a constexpr left at its default and one set."""
    src = torch.randn(1000 + offset, device=runtime.DEVICE)[offset:]
    for add_one in (False, True):
        expected = src * 0.5 + add_one
        for _ in range(2):
            dst = torch.full_like(src, float("nan"))
            constexprs = {"ADD_ONE": True} if add_one else {}
            runtime.launch(_scaled_copy_kernel, (runtime.cdiv(1000, 128),), src, dst, 1000, 0.5, BLOCK=128,
                           num_warps=2, **constexprs)
            torch.testing.assert_close(dst, expected)


def test_kernel_grid_launches_gives_the_same_and_restores_direct_launches():
    src = torch.randn(300, device=runtime.DEVICE)
    direct = runtime._direct_launch
    with runtime.kernel_grid_launches():
        assert runtime._direct_launch is False
        dst = torch.empty_like(src)
        runtime.launch(_scaled_copy_kernel, (runtime.cdiv(300, 128),), src, dst, 300, 2.0, BLOCK=128)
        torch.testing.assert_close(dst, src * 2.0)
    assert runtime._direct_launch is direct
    with pytest.raises(RuntimeError, match="inside"):
        with runtime.kernel_grid_launches():
            raise RuntimeError("a failure inside the block")
    assert runtime._direct_launch is direct


@gpu_only  # the interpreter calls no launch hooks
def test_launch_hooks_see_every_launch_and_then_none():
    """A profiler's launch hooks (triton.knobs.runtime) see direct launches too, with the
    kernel's name; once removed, launches go on without them."""
    src = torch.randn(300, device=runtime.DEVICE)
    dst = torch.empty_like(src)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    def launch():
        runtime.launch(_scaled_copy_kernel, (runtime.cdiv(300, 128),), src, dst, 300, 3.0, BLOCK=128)

    launch()  # compiled outside the hook
    runtime.triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        for _ in range(2):
            launch()
    finally:
        runtime.triton.knobs.runtime.launch_enter_hook.remove(hook)
    launch()
    torch.testing.assert_close(dst, src * 3.0)
    assert seen == ["_scaled_copy_kernel"] * 2


def _pinned_triton_versions():
    root = Path(__file__).resolve().parents[2]
    pins = {}
    for name in ("requirements.txt", "requirements-floor.txt", "requirements-triton-latest.txt"):
        for line in (root / name).read_text().splitlines():
            if line.startswith("triton=="):
                pins[name] = line.split("==")[1].split(";")[0].strip()
    return pins


def test_direct_launches_only_on_releases_checked_and_kernel_grid_elsewhere():
    """Every Triton the package pins either takes the direct path (checked on a GPU by the
    tests above, on the GPU runs' Triton 3.6) or falls back to kernel[grid]."""
    pins = _pinned_triton_versions()
    assert set(pins) == {"requirements.txt", "requirements-floor.txt", "requirements-triton-latest.txt"}
    assert runtime.direct_launch_supported(pins["requirements-floor.txt"])  # the GPU runs' release
    assert not runtime.direct_launch_supported(pins["requirements-triton-latest.txt"])
    assert not runtime.direct_launch_supported("3.10.0") and not runtime.direct_launch_supported("3.60.0")
    assert runtime._direct_launch == (runtime.ON_GPU and runtime.direct_launch_supported(runtime.triton.__version__))


@gpu_only
def test_cooperative_launches_are_available_on_a_gpu():
    """Without them the kernels whose programs wait on each other take their two-launch
    paths everywhere: safe, but slower on wide rows."""
    assert runtime.cooperative_launch_supported()
    assert runtime.spin_waits_allowed(torch.empty(1, device=runtime.DEVICE))


def test_launches_from_several_threads_give_what_one_thread_gives():
    """Triton's interpreter keeps the running grid in globals; launches from a thread pool
    gave other calls' values or errors from inside Triton until launch serialised them."""
    import concurrent.futures

    from course_lib import coor_descent, weighted_sum

    torch.manual_seed(0)
    inputs = [torch.randn(3 + i % 5, 8 + i, device=runtime.DEVICE) for i in range(12)]

    def call(x):
        return coor_descent(x, n_iters=3, k=2), weighted_sum(x, torch.ones(x.shape[-1], device=runtime.DEVICE))

    one_thread = [call(x) for x in inputs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        several = list(pool.map(call, inputs))
    for want, got in zip(one_thread, several):
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


@triton.jit
def _tile_product_kernel(a_ptr, b_ptr, out_ptr, SIZE: tl.constexpr):
    rows = tl.arange(0, SIZE)
    offsets = rows[:, None] * SIZE + rows[None, :]
    tl.store(out_ptr + offsets, tl.dot(tl.load(a_ptr + offsets), tl.load(b_ptr + offsets)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tl_dot_of_16_bit_tiles_is_their_product_interpreted_or_compiled(dtype):
    # Triton's interpreter multiplies bfloat16 tiles as their raw bits unless runtime widens them.
    from course_lib.teaching.student_kernels import interpreted

    a, b = (torch.randn(16, 16, device=runtime.DEVICE).to(dtype) for _ in range(2))
    expected = a.double() @ b.double()
    with interpreted(_tile_product_kernel) as kernel:  # on a GPU machine, its interpreted pass
        out = torch.empty(16, 16, device=runtime.DEVICE)
        kernel[(1,)](a, b, out, SIZE=16)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    if runtime.ON_GPU:
        out = torch.empty(16, 16, device=runtime.DEVICE)
        _tile_product_kernel[(1,)](a, b, out, SIZE=16)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@triton.jit
def _bfloat16_arithmetic_kernel(x_ptr, y_ptr, out_ptr, scale, SIZE: tl.constexpr):
    offsets = tl.arange(0, SIZE)
    x, y = tl.load(x_ptr + offsets), tl.load(y_ptr + offsets)
    result = tl.where(x > y, x * scale + y, x - y * y)
    tl.store(out_ptr + offsets, result)


def test_bfloat16_arithmetic_is_a_gpus_under_the_interpreter():
    # On bfloat16 tiles the interpreter computed with the raw 16-bit patterns (or stopped at a scalar).
    from course_lib.teaching.student_kernels import interpreted

    x, y = (torch.randn(64, device=runtime.DEVICE).bfloat16() for _ in range(2))
    scale = 0.37
    expected = torch.where(x > y, x * scale + y, x - y * y)  # PyTorch's bfloat16, rounded each step
    with interpreted(_bfloat16_arithmetic_kernel) as kernel:
        out = torch.empty_like(x)
        kernel[(1,)](x, y, out, scale, SIZE=64)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not runtime.ON_GPU, reason="CPU tensors beside a GPU")
def test_cpu_tensors_beside_a_gpu_are_computed_by_the_references():
    import course_lib

    x = torch.randn(5, 37)
    torch.testing.assert_close(course_lib.softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(course_lib.layernorm(x, None), torch.nn.functional.layer_norm(x, (37,)))
    with pytest.raises(ValueError, match="weight is on cuda.* but x is on cpu|x is on cpu.* but weight|same device"):
        course_lib.weighted_sum(x, torch.randn(37, device="cuda"))
