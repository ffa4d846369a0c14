"""What course_lib exports (course_lib/__init__.py) documents itself as PyTorch's API does."""

import inspect
import subprocess
import sys

import pytest
import torch

import course_lib

CLASSES = [course_lib.RoutedBlock, course_lib.LayerNorm, course_lib.CoordinateDescentRouter]
FUNCTIONS = [course_lib.weighted_sum, course_lib.softmax, course_lib.causal_softmax, course_lib.layernorm,
             course_lib.coor_descent, course_lib.local_causal_attention]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_classes_document_their_arguments_and_forward(cls):
    assert "0x" not in str(inspect.signature(cls)), "a default shows as a memory address"
    assert cls.__doc__ and cls.forward.__doc__, f"help({cls.__name__}) would show nn.Module's text"
    assert "(" in cls.forward.__doc__, f"{cls.__name__}.forward's docstring names no shape"


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.__name__)
def test_functions_document_shapes_and_dtypes(function):
    doc = inspect.getdoc(function) or ""
    assert "(" in doc and any(dtype in doc for dtype in ("float32", "float16", "bfloat16", "dtype")), function.__name__


def test_a_named_limit_comes_with_its_value():
    assert f"MAX_HEAD_DIM ({course_lib.MAX_HEAD_DIM})" in course_lib.local_causal_attention.__doc__


# Every callable course_lib exports (modules and constants have no signature to document).
EXPORTED_CALLABLES = [name for name in course_lib.__all__
                      if callable(getattr(course_lib, name)) and not inspect.ismodule(getattr(course_lib, name))]


@pytest.mark.parametrize("name", EXPORTED_CALLABLES)
def test_every_exported_name_documents_args_shape_returns_and_an_example(name):
    doc = inspect.getdoc(getattr(course_lib, name)) or ""
    missing = [section for section in ("Args:", "Shape:", "Returns:", "Example::") if f"\n{section}" not in doc]
    assert not missing, f"help(course_lib.{name}) has no {', '.join(missing)} section (torch's layout)"


def test_recall_models_impl_is_documented():
    assert "impl (str)" in course_lib.RecallModel.__doc__


@pytest.mark.parametrize("name", ["weighted_sum", "softmax", "causal_softmax", "layernorm", "coor_descent", "matmul",
                                  "RoutedBlock"])
def test_a_numpy_array_is_refused_naming_the_argument(name):
    import numpy as np

    array = np.zeros((2, 4, 4), dtype=np.float32)
    calls = {
        "weighted_sum": lambda: course_lib.weighted_sum(array, torch.zeros(4)),
        "softmax": lambda: course_lib.softmax(array),
        "causal_softmax": lambda: course_lib.causal_softmax(array),
        "layernorm": lambda: course_lib.layernorm(array, None),
        "coor_descent": lambda: course_lib.coor_descent(array, n_iters=2, k=1),
        "matmul": lambda: course_lib.matmul(array, torch.zeros(4, 4)),
        "RoutedBlock": lambda: course_lib.RoutedBlock(4, num_heavy_tokens=2, heads=1, dim_head=4)(array),
    }
    argument = "a" if name == "matmul" else "s" if name == "coor_descent" else "x"
    with pytest.raises(TypeError, match=rf"{name}: {argument} must be a torch.Tensor, got ndarray; convert a NumPy "
                                        rf"array with torch.from_numpy\({argument}\)"):
        calls[name]()


def test_importing_course_lib_and_calling_every_kernel_leaves_matplotlib_out():
    """matplotlib is the teaching extra's (pyproject.toml): the kernels and models never need it."""
    script = (
        "import sys, torch, course_lib as c\n"
        "x = torch.randn(4, 4)\n"
        "c.weighted_sum(x, x[0]); c.softmax(x); c.causal_softmax(x); c.layernorm(x, x[0]); c.layer_norm(x, 4)\n"
        "c.LayerNorm(4)(x); c.coor_descent(x, n_iters=2, k=2); c.matmul(x, x, activation='gelu')\n"
        "q = torch.randn(1, 1, 4, 4); c.local_causal_attention(q, q, q, 2)\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
