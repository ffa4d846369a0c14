"""What course_lib exports (course_lib/__init__.py) documents itself as PyTorch's API does."""

import inspect

import pytest

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
