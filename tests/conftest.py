import math
import os

import pytest
import torch

from course_lib.runtime import DEVICE, ON_GPU

# Tolerances against a float64 reference: float32 math lands far below 1e-5;
# float16 and bfloat16 outputs carry one rounding of 2**-11 and 2**-8.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = list(TOLERANCES)


@pytest.fixture(autouse=True)
def fresh_seed():
    """A new random seed for every test, printed so a failure can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"torch seed {seed}")
    return seed


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
