"""One way to make a kernel an operator: its torch.library operators, its autograd,
and the dispatch between them, from a forward, a backward and what the backward saves.

A kernel module states, once each:

- the forward, ``def NAME(*inputs)`` under ``@differentiable_op(...)``: launches the
  forward; typed, since its annotations are the operator's schema; returns a tensor or a
  tuple of tensors, the first what the caller gets, the others state the backward needs
  (row statistics, a log-sum-exp);
- ``backward(*arguments)``: launches the backward; typed the same way;
- ``save(ctx, inputs, output)``: what the backward needs, on ``ctx``;
- ``gradients(ctx, backward, grad)``: the gradient of every input from the gradient of
  the first output, calling ``backward`` (given to it: see below);
- ``check(*inputs)``: the input checks of the public function, which the operator makes
  too when it is called directly (``torch.ops.course_lib.<name>``), and
  ``check_backward(*arguments)``, the backward operator's: the shapes, dtypes and devices
  of what the forward saved, so that neither operator reads memory it was not given.

From these :func:`differentiable_op` builds a :class:`KernelOp`, bound to the forward's
name, so that a public function calls ``NAME(...)`` and a reader (or a tool that follows
calls) goes from there to the code that launches the kernels:

- ``operator`` and ``backward_operator``, ``course_lib::<name>`` and
  ``course_lib::<name>_backward``, what torch.compile traces (chapter 5). On a GPU they
  are ``torch.library.triton_op`` operators: torch.compile runs their bodies once on fake
  tensors, ``runtime.launch`` records every kernel through ``torch.library.wrap_triton``,
  and inductor then launches those kernels from its own code. Their autograd is
  ``gradients`` with ``backward_operator``.
- ``Function``, a ``torch.autograd.Function`` for eager calls, whose backward is the same
  ``gradients`` with the ``backward`` launcher itself: the dispatcher an operator goes
  through costs tens of microseconds of host time a call.
- calling the ``KernelOp`` picks one of the two, or, when no gradient is wanted, the
  bare forward, which skips autograd's bookkeeping too.
"""

import functools
from typing import Callable, NamedTuple

import torch

from .runtime import kernel_operator
from .validation import first_order_only, first_order_only_as, held_for_first_order_only, wants_gradient


def _first(output):
    return output[0] if isinstance(output, tuple) else output


class KernelOp(NamedTuple):
    name: str  # of the operators, course_lib::<name> and course_lib::<name>_backward
    error_name: str  # of the public function, in errors
    operator: Callable
    backward_operator: Callable
    Function: type
    differentiable: dict  # input name -> position, for wants_gradient's checks and messages
    inference: Callable  # the forward's first output, when nothing is differentiated
    finish: Callable  # applied to the first output on every path (a transpose, a cast)

    def __call__(self, *inputs, error_name=None, input_names=None):
        """The first output of the forward, by the cheapest path that keeps autograd
        and torch.compile correct. The caller has checked ``inputs``. Where one operator
        serves several public callers (softmax and causal_softmax, layernorm and
        LayerNorm), ``error_name`` and ``input_names`` (for ``differentiable``, in order)
        are the caller's names for errors."""
        if torch.compiler.is_compiling():
            return self.finish(_first(self.operator(*inputs)))
        tensors = [inputs[i] for i in self.differentiable.values()]
        if wants_gradient(error_name or self.error_name, input_names or self.differentiable, tensors):
            function = self.Function if error_name in (None, self.error_name) else first_order_only_as(
                self.Function, error_name)
            return self.finish(function.apply(*inputs))
        return self.finish(self.inference(*inputs))


def _graph_input_needing_grad(inputs, positions):
    """The first input at ``positions`` that requires grad and is computed from nothing else
    that does: a leaf, or, while AOTAutograd traces, one of the graph's inputs (its grad_fn
    is a node of its own, with no edges). None if there is none."""
    return next((t for t in (inputs[i] for i in positions)
                 if isinstance(t, torch.Tensor) and t.requires_grad
                 and (t.grad_fn is None or not t.grad_fn.next_functions)), None)


def differentiable_op(name, *, backward, save, gradients, check, check_backward, differentiable,
                      inference=None, eager_backward=None, finish=lambda output: output, error_name=None,
                      function_name=None, anchored=False):
    """Decorator: the function below it is the forward, and its name becomes the
    :class:`KernelOp` of one kernel, its operators, autograd.Function and dispatch (see
    the module's docstring)::

        @differentiable_op("softmax", backward=_backward, save=..., gradients=..., ...)
        def SOFTMAX(x: torch.Tensor, causal: bool, diagonal: int) -> torch.Tensor:
            return softmax_forward(x, causal, diagonal=diagonal)

    so that a public function's ``SOFTMAX(...)`` names the code that launches the kernels.

    ``differentiable`` names the inputs that may need a gradient, with their
    positions; ``inference`` is a cheaper forward for calls that need no gradient (by
    default ``forward``'s first output); ``eager_backward`` is the backward the eager Function
    calls, where it may skip what only an operator needs (a copy so outputs do not alias; by
    default ``backward``); ``error_name`` names the function in errors (by
    default ``name``); ``function_name`` names the autograd.Function (by default
    ``<Name>Function``), as profiles and autograd's nodes show it.

    ``anchored``: ``backward`` takes ``anchor``, a tensor its kernels receive and never
    read, for a backward that reads no input, only what the forward computed (softmax's
    output). Before torch 2.13, AOTAutograd hands a compiled graph's first-order gradients
    back detached, so that a gradient penalty silently loses its second-order terms, unless
    its backward reads a graph input that requires grad; then it refuses the penalty. The
    operator's backward passes the first input that is such a leaf as the anchor."""
    error_name = error_name or name
    eager_backward = eager_backward or backward
    positions = tuple(differentiable.values())

    def decorate(forward):

        def checked_forward(*inputs):
            check(*inputs)
            return forward(*inputs)

        def checked_backward(*arguments, **anchor):
            check_backward(*arguments, **anchor)
            return backward(*arguments, **anchor)

        functools.update_wrapper(checked_forward, forward)
        functools.update_wrapper(checked_backward, backward)
        operator = kernel_operator(f"course_lib::{name}")(checked_forward)
        backward_operator = kernel_operator(f"course_lib::{name}_backward")(checked_backward)

        def operator_save(ctx, inputs, output):
            save(ctx, inputs, output)
            ctx.anchor = _graph_input_needing_grad(inputs, positions) if anchored else None

        def operator_gradients(ctx, grad, *_grads_of_state):  # the state outputs are never differentiated
            if ctx.anchor is None:
                return gradients(ctx, backward_operator, grad)
            return gradients(ctx, functools.partial(backward_operator, anchor=ctx.anchor), grad)

        operator.register_autograd(operator_gradients, setup_context=operator_save)

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                output = forward(*inputs)
                save(ctx, inputs, output)
                ctx.inputs_needing_grad = held_for_first_order_only(*(inputs[i] for i in positions))
                return _first(output)

            @staticmethod
            @first_order_only(error_name)
            def backward(ctx, grad):
                return gradients(ctx, eager_backward, grad)

        Function.__name__ = Function.__qualname__ = (
            function_name or "".join(part.title() for part in name.split("_")) + "Function")
        first_output = inference
        if first_output is None:
            def first_output(*inputs):
                return _first(forward(*inputs))
        return KernelOp(name, error_name, operator, backward_operator, Function, dict(differentiable), first_output,
                        finish)

    return decorate

