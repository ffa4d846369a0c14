import math
import os
import sys
import zlib

import pytest
import torch

from course_lib.core import runtime
from course_lib.core.runtime import DEVICE, ON_GPU

# Without a GPU the tests run the kernels in Triton's interpreter (not PyTorch's references,
# which course_lib computes CPU tensors with otherwise): switched on before any test module
# defines a kernel.
runtime.use_interpreter()

# Tolerances against a float64 reference: float32 math lands far below 1e-5;
# float16 and bfloat16 outputs carry one rounding of 2**-11 and 2**-8.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = list(TOLERANCES)


# COURSE_LIB_SEED=<int> replays a run (a failing test prints its seed); COURSE_LIB_SEED=fresh
# draws new seeds. By default every run uses the same seeds.
SEED_SETTING = os.environ.get("COURSE_LIB_SEED", "0")


@pytest.fixture(autouse=True)
def seed(request):
    """Every test's own seed: the run's base seed (COURSE_LIB_SEED, 0 by default, or
    ``fresh``) mixed with the test's name, so tests do not share their random inputs.
    Printed, so that a failure says how to replay it."""
    base = int.from_bytes(os.urandom(4), "little") if SEED_SETTING == "fresh" else int(SEED_SETTING)
    test_seed = (base + zlib.crc32(request.node.nodeid.encode())) % 2**32
    torch.manual_seed(test_seed)
    print(f"torch seed {test_seed}; replay with COURSE_LIB_SEED={base} pytest '{request.node.nodeid}'")
    return test_seed


@pytest.fixture(autouse=True)
def close_figures():
    """A checker's error map stays open under the tests' non-interactive backend (a
    notebook's closes it once shown): closed after each test, not kept for the run."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def assert_matches(got, expected, dtype, length=1, what="output", scale=1.0):
    """got (kernel, in ``dtype``) against a float64 reference.

    ``length`` is the number of terms summed into each value: the absolute error
    allowed grows with its square root, as the values themselves do on random data.
    ``scale`` multiplies the absolute error allowed, for values computed through a
    factor larger than the inputs (a LayerNorm's 1/std, say).
    """
    rtol, atol = TOLERANCES[dtype]
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(
        got.double(), expected, rtol=rtol, atol=atol * scale * math.sqrt(max(length, 1)), msg=lambda m: f"{what}: {m}"
    )


def poison_cached_memory(n_bytes):
    """On a GPU, leave NaNs in freed cached memory so unwritten outputs show up."""
    if ON_GPU:
        torch.full((n_bytes // 4 + 1024,), float("nan"), device=DEVICE)


gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: races and speed do not show in the interpreter")


# torch.compile as the tests run it: inductor and CUDA graphs on a GPU; on a CPU the
# kernels run in the interpreter, which inductor cannot compile around, so AOTAutograd
# traces the graph and runs it eagerly.
COMPILE_MODES = ["default", "reduce-overhead"] if ON_GPU else ["aot_eager"]


def _run_step(fn, inputs, grad_scale):
    """fn(*inputs) and the gradients of (output * grad_scale).sum() for every input that wants one."""
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    for t in leaves:
        t.grad = None
    y = fn(*inputs)
    if leaves:
        y.backward(grad_scale.expand_as(y))
    return [y.detach().clone()] + [t.grad.clone() for t in leaves]


def assert_compiles_whole(fn, *inputs, mode, op):
    """``fn`` traces into one graph under torch.compile(fullgraph=True) that calls the
    custom operator ``op``, and gives the values and gradients of ``fn`` run eagerly.

    Compiled again each time (torch._dynamo.reset), so that tests never reach dynamo's
    recompile limit, past which it would quietly run eagerly. Runs three times: under
    CUDA graphs the first call warms up, the second records and the third replays.
    """
    torch._dynamo.reset()
    first = next(t for t in inputs if isinstance(t, torch.Tensor))
    grad_scale = torch.tensor(0.37, device=first.device, dtype=first.dtype)
    expected = _run_step(fn, inputs, grad_scale)
    if mode == "aot_eager":
        graphs = []

        def recording_backend(graph_module, example_inputs):
            # Its own code and its subgraphs' (an autograd.Function's body is one).
            graphs.append("\n".join(m.code for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)))
            return torch._dynamo.backends.registry.lookup_backend("aot_eager")(graph_module, example_inputs)

        compiled = torch.compile(fn, fullgraph=True, backend=recording_backend)
    else:
        compiled = torch.compile(fn, fullgraph=True, mode=mode)
    for _ in range(3):
        got = _run_step(compiled, inputs, grad_scale)
    if mode == "aot_eager":
        assert len(graphs) == 1 and f"course_lib.{op}" in graphs[0], f"the graph does not call course_lib::{op}"
    for what, g, e in zip(["output"] + [f"gradient {i}" for i in range(len(got) - 1)], got, expected):
        torch.testing.assert_close(g, e, msg=lambda m: f"compiled ({mode}) {what}: {m}")


def assert_compiled_refuses(fn, *inputs, error, match):
    """Bad input raises the eager error under torch.compile too; with fullgraph=True,
    dynamo reports it as unsupported but still names what was wrong."""
    torch._dynamo.reset()
    with pytest.raises(error, match=match):
        torch.compile(fn, backend="aot_eager")(*inputs)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=match):
        torch.compile(fn, backend="aot_eager", fullgraph=True)(*inputs)


def far_apart(values, tmp_path):
    """``values`` (1-D, float32) as a view whose stride fits in 32 bits but whose last
    element lies past 2**31 elements: an index times the stride overflows 32-bit
    arithmetic. Under the interpreter the storage is a file with holes (no memory used);
    on a GPU 8.6 GB of its memory."""
    n = values.numel()
    stride = 2**31 // (n - 1) + 1
    size = (n - 1) * stride + 1
    if ON_GPU:
        storage = torch.zeros(size, device=DEVICE)
    else:
        path = tmp_path / "far_apart.bin"
        with open(path, "wb") as file:
            file.truncate(size * 4)
        storage = torch.from_file(str(path), shared=True, size=size, dtype=torch.float32)
    view = storage.as_strided((n,), (stride,))
    view.copy_(values)
    return view
