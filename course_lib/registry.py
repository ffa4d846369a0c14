"""The kernels the package ships, listed once.

The benchmarks runner (``python -m benchmarks``), the GPU run (``scripts/gpu_run.sh``),
the performance targets (``benchmarks/targets.py``) and the tests read this list; adding a
kernel means its module, its test, its benchmark and one entry here (CONTRIBUTING.md,
"Adding a kernel").

    python -m course_lib.registry          # the benchmark names, one a line
"""

import importlib
from typing import NamedTuple


class Kernel(NamedTuple):
    """One benchmarked unit of the package.

    ``name``: its benchmark, ``benchmarks/bench_<name>.py``, which has ``run(copy_gbps)``.
    ``module``: where it lives, below ``course_lib``.
    ``functions``: the public functions (or classes) it gives, all exported by ``course_lib``;
    its results rows and targets are named by these or by ``name``.
    ``references``: the ``course_lib.core.references`` functions that specify it.
    ``test``: its test file, which mirrors ``module``.
    ``variants``: other names its rows may carry, for a variant benchmarked beside it
    (matmul's fused epilogue, "matmul_bias_gelu").
    """

    name: str
    module: str
    functions: tuple
    references: tuple
    test: str
    variants: tuple = ()

    @property
    def benchmark(self):
        return f"benchmarks.bench_{self.name}"

    @property
    def result_names(self):
        """The names its rows in the results file may carry under ``"kernel"``."""
        return (self.name, *self.functions, *self.variants)

    def load(self):
        """The module itself."""
        return importlib.import_module(f"course_lib.{self.module}")


KERNELS = (
    Kernel("weighted_sum", "kernels.weighted_sum_op", ("weighted_sum",), ("weighted_sum", "weighted_sum_backward"),
           "tests/kernels/test_weighted_sum_op.py"),
    Kernel("softmax", "kernels.softmax_op", ("softmax", "causal_softmax"),
           ("softmax", "causal_softmax", "softmax_backward"), "tests/kernels/test_softmax_op.py"),
    Kernel("layernorm", "kernels.layernorm_op", ("layernorm", "LayerNorm"), ("layernorm",),
           "tests/kernels/test_layernorm_op.py"),
    Kernel("coor_descent", "kernels.coor_descent_op", ("coor_descent",), ("coor_descent",),
           "tests/kernels/test_coor_descent_op.py"),
    Kernel("local_attention", "kernels.local_attention_op", ("local_causal_attention",), ("local_causal_attention",),
           "tests/kernels/test_local_attention_op.py"),
    Kernel("matmul", "kernels.matmul_op", ("matmul",), ("matmul",), "tests/kernels/test_matmul_op.py",
           variants=("matmul_bias_gelu",)),
    # A model, not a kernel, benchmarked the same way: the four kernels at work in one block.
    Kernel("routed_block", "models.routed", ("RoutedBlock",), ("routed_causal_attention",),
           "tests/models/test_routed.py"),
)

BY_NAME = {kernel.name: kernel for kernel in KERNELS}


def kernel_of_result(result_name):
    """The registry entry a results row's ``"kernel"`` belongs to."""
    for kernel in KERNELS:
        if result_name in kernel.result_names:
            return kernel
    raise KeyError(f"no kernel in course_lib.registry gives results named {result_name!r}")


if __name__ == "__main__":
    print("\n".join(kernel.name for kernel in KERNELS))
