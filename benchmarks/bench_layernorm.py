"""LayerNorm against torch.nn.functional.layer_norm (eager) and its torch.compile: forward,
backward, and the training step (both, as a user's loop calls them, also inside
torch.compile(mode="reduce-overhead")).

Bytes counted: forward reads x and writes y (2·M·N·es); the backward reads x and dy and
writes dx (3·M·N·es); the step both (5·M·N·es) — gamma, beta, their gradients and the
row statistics are small.

Beside float32 and bfloat16, the mixed-precision case: bfloat16 x with float32 weight and
bias, as an autocast model feeds its LayerNorm; its rows' dtype reads "bfloat16 (float32
params)". torch takes that only under autocast (on a GPU its layer_norm refuses mixed
dtypes otherwise), which runs it in float32 and returns float32: its rows are that, as an
autocast training step runs it. course_lib returns bfloat16.
"""

import torch
import torch.nn.functional as F

from course_lib.core.benchmarking import forward_backward_ms, fresh_compile, row, step_rows
from course_lib.kernels.layernorm_op.whole_rows import layernorm

SHAPES = [(16384, 1024), (8192, 4096), (4096, 8192), (2048, 32768), (512, 2**17)]
# The training step, eager and compiled, at a host-bound shape and a GPU-bound one.
STEP_SHAPES = [(16384, 1024), (4096, 8192)]
DTYPES = [torch.float32, torch.bfloat16]
MIXED = (torch.bfloat16, torch.float32)  # x's dtype, the parameters'


def torch_layernorm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def torch_layernorm_autocast(x, weight, bias):
    with torch.autocast("cuda", dtype=x.dtype):
        return F.layer_norm(x, (x.shape[-1],), weight, bias)


def _label(dtype, param_dtype):
    name = str(dtype).replace("torch.", "")
    return name if param_dtype == dtype else f"{name} ({str(param_dtype).replace('torch.', '')} params)"


def run(copy_gbps, shapes=SHAPES, dtypes=DTYPES, mixed=True, steps_only=False):
    rows = []
    cases = [(dtype, dtype) for dtype in dtypes] + ([MIXED] if mixed else [])
    for dtype, param_dtype in cases:
        label = _label(dtype, param_dtype)
        for shape in shapes:
            if steps_only and shape not in STEP_SHAPES:
                continue
            x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            weight = torch.randn(shape[-1], device="cuda", dtype=param_dtype, requires_grad=True)
            bias = torch.randn(shape[-1], device="cuda", dtype=param_dtype, requires_grad=True)
            n_bytes = x.numel() * x.element_size()
            reference = torch_layernorm if param_dtype == dtype else torch_layernorm_autocast
            impls = {"course_lib": layernorm, "torch": reference, "torch.compile": fresh_compile(reference)}
            for impl, fn in () if steps_only else impls.items():
                fwd, bwd = forward_backward_ms(fn, x, weight, bias)
                rows.append(row("layernorm", "fwd", impl, label, shape, fwd, 2 * n_bytes, copy_gbps))
                rows.append(row("layernorm", "bwd", impl, label, shape, bwd, 3 * n_bytes, copy_gbps))
            if shape in STEP_SHAPES:
                rows += step_rows("layernorm", label, shape, layernorm, reference, (x, weight, bias),
                                  5 * n_bytes, copy_gbps)
    return rows
