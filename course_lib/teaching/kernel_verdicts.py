"""Verdicts on returned answers from a process the return's code never runs in.

A checker that calls a student's Python in its own process can be reached from that code:
an answer can walk the stack up to the grader and write "passed" where results go. A
kernel exercise's answer is a ``@triton.jit`` function, and a Triton kernel needs no
Python but Triton's language. So grading takes each kernel checker's answer out of the
returned notebook *as source*, checks that it is one ``@triton.jit`` function written in
Triton's language alone (no imports, no names beginning with ``__``, no attribute but
``tl``'s and a tensor's, a few harmless builtins), and runs the released checker on it in
a fresh process (:func:`main`) that holds nothing of the notebook. That process prints
each verdict after a secret the grader gives it on stdin, which the kernel cannot read:
a line the kernel writes to stdout without it counts for nothing.

The PyTorch exercises (1.2, 3.2, 4.1 and 5.1: an ``Exercise`` with ``kernel=False`` whose
checker cell hands one name to its checker) are judged the same way. Their answer is one
plain ``def`` written in "PyTorch's language" (:func:`check_torch_source`): no imports, no
``global``/``nonlocal``, no name (but ``_`` itself) or attribute beginning with ``_``, no
``try``/``with``/``class``, no decorator, no attribute set; it reads
only its own arguments and locals, ``torch``, ``F`` (``torch.nn.functional``), ``math`` and
a short list of harmless builtins (TORCH_BUILTINS); of ``torch``, ``F``, ``math`` only the
functions and constants of an allowlist (TORCH_FUNCTIONS...), none of which does I/O, loads
code or reaches autograd; of any other value only the public names of a tensor, dtype,
finfo, device or size, less a denylist (hooks, storages, shared memory...). Where the
exercise asks for its result without autograd (WITHOUT_AUTOGRAD_CHECKERS) autograd's names,
``.backward``, ``.grad``, ``.requires_grad_``..., are refused too, and the released checker's
own watch (``checking.without_autograd``) still runs on the call in the fresh process.
Lambdas, nested functions and comprehensions are allowed when their bodies pass the same
checks. The function runs in a module whose only names are those, from a file of its own.

Exercise 5.3 (the kernels made an operator with ``torch.library``) is not judged here: its
checker takes three answers, one of them a ``torch.library`` operator registered by the
notebook, whose Python cannot be allowlisted this way; it is still judged in the
notebook's process (``fresh_checker.run_checker``), where only the tampering checks of
``instructor.grade_notebook`` guard it.

This file is run by path, from the grader's copy of the package:
``python kernel_verdicts.py PACKAGE_DIR SPEC_JSON`` with the secret on stdin.
"""

import ast
import builtins
import json
import sys

JIT_DECORATOR = "triton.jit"
# Builtins a kernel may call (the rest, __import__, open, getattr, eval..., are not there).
KERNEL_BUILTINS = ("range", "min", "max", "abs", "int", "float", "bool", "len", "print", "isinstance", "tuple")
# What a kernel's statements and expressions may be: Triton's language, no Python beyond it.
ALLOWED_NODES = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.For, ast.While, ast.If, ast.IfExp, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.keyword,
    ast.Attribute, ast.Name, ast.Constant, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Return, ast.Pass,
    ast.Break, ast.Continue, ast.Load, ast.Store, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context,
    ast.Assert,
)


class NotAKernel(ValueError):
    """A returned answer that is not one @triton.jit function in Triton's language."""


def _tensor_attributes():
    """Attribute names a kernel may read off a value: the public names of Triton's tensor,
    dtype and pointer types (``x.to``, ``x.dtype.element_ty``, ``x.shape``...)."""
    import triton.language as tl

    names = {"shape", "dtype", "T", "type", "element_ty", "numel"}
    for cls in (tl.tensor, tl.dtype, tl.pointer_type):
        names |= {name for name in dir(cls) if not name.startswith("_")}
    return names


def _language_names():
    """``tl.<name>`` a kernel may use: triton.language's public functions, types and
    constants (its submodules ``math`` and ``extra`` reach only their own functions)."""
    import types

    import triton.language as tl

    return {name for name in dir(tl) if not name.startswith("_") and not isinstance(getattr(tl, name), types.ModuleType)}


def _last_definition(cells_source, name):
    """The source of the last top-level ``def name(...)`` among ``cells_source``, its
    decorators included, or None (none, or a later top-level assignment replaces it)."""
    found = None
    for source in cells_source:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # a cell that is not Python (a magic): it defines no function
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found = (source, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(target, ast.Name) and target.id == name
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                found = None  # a later assignment replaces the function
    if found is None:
        return None
    source, node = found
    lines = source.splitlines()
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    return "\n".join(lines[first - 1:node.end_lineno]) + "\n"


def kernel_definition(cells_source, name):
    """The source of the last top-level ``@triton.jit def name(...)`` among ``cells_source``
    (the code cells of a returned notebook), or raise NotAKernel saying what is there."""
    source = _last_definition(cells_source, name)
    if source is None:
        raise NotAKernel(f"no top-level `@triton.jit def {name}(...)` in the notebook: the grader takes the kernel "
                         "from its definition")
    return source


def check_kernel_source(source, name):
    """Raise NotAKernel unless ``source`` is exactly one function ``name`` decorated
    ``@triton.jit`` whose body uses Triton's language alone."""
    tree = ast.parse(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != name:
        raise NotAKernel(f"the answer must be one function `{name}`")
    function = tree.body[0]
    if len(function.decorator_list) != 1 or ast.unparse(function.decorator_list[0]) != JIT_DECORATOR:
        raise NotAKernel(f"`{name}` must be decorated `@{JIT_DECORATOR}` and nothing else")
    language, attributes = _language_names(), _tensor_attributes()
    parameters = {arg.arg for arg in function.args.args}
    inside = [function.args, *function.body]  # not the decorator, checked above
    for node in (node for part in inside for node in ast.walk(part)):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            raise NotAKernel(f"`{name}` defines a function inside it (line {node.lineno}): a kernel is one function")
        if not isinstance(node, ALLOWED_NODES):
            raise NotAKernel(f"`{name}` uses {type(node).__name__} (line {node.lineno}), which Triton kernels "
                             "do not need")
        if isinstance(node, ast.Name) and (node.id.startswith("__") or node.id == "triton"):
            raise NotAKernel(f"`{name}` names `{node.id}` (line {node.lineno}): a kernel uses tl and its own values")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and hasattr(builtins, node.id) \
                and node.id not in KERNEL_BUILTINS and node.id not in parameters:
            raise NotAKernel(f"`{name}` calls the builtin `{node.id}` (line {node.lineno})")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise NotAKernel(f"`{name}` reads `.{node.attr}` (line {node.lineno})")
            if isinstance(node.value, ast.Name) and node.value.id == "tl":
                if node.attr not in language:
                    raise NotAKernel(f"`{name}` uses `tl.{node.attr}` (line {node.lineno}), not a function or type "
                                     "of triton.language")
            elif node.attr not in attributes:
                raise NotAKernel(f"`{name}` reads `.{node.attr}` (line {node.lineno}), not an attribute of a "
                                 "Triton tensor or type")


def load_kernel(source, name, folder):
    """The kernel defined by ``source`` (checked first), from a file of its own in
    ``folder`` (Triton reads a kernel's source from its file), in a module whose only
    names are ``triton``, ``tl`` and KERNEL_BUILTINS."""
    import importlib.util
    from pathlib import Path

    import triton
    import triton.language as tl

    check_kernel_source(source, name)
    path = Path(folder) / f"returned_{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"returned_{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(triton=triton, tl=tl,
                           __builtins__={name: getattr(builtins, name) for name in KERNEL_BUILTINS})
    spec.loader.exec_module(module)
    return getattr(module, name)


# --- PyTorch answers ------------------------------------------------------------------

class NotPyTorch(ValueError):
    """A returned answer that is not one plain function in the grader's PyTorch language."""


# Checkers of the exercises that ask for their result without autograd (their checkers run the
# answer inside checking.without_autograd): there autograd's names are refused by name too.
WITHOUT_AUTOGRAD_CHECKERS = frozenset({"check_weighted_sum_grads", "check_layernorm_dx"})
# The names a PyTorch answer reads besides its own: the modules the notebooks import.
TORCH_MODULES = ("torch", "F", "math")
# Builtins a PyTorch answer may call (the rest, __import__, open, getattr, eval, globals..., are not there).
TORCH_BUILTINS = ("range", "len", "min", "max", "abs", "int", "float", "bool", "sum", "zip", "enumerate", "tuple",
                  "list", "dict", "set", "isinstance", "print", "round", "reversed", "sorted", "any", "all", "slice",
                  "divmod", "pow", "map", "filter")
# torch.<name> an answer may use: math, reductions, tensor creation and shaping, dtypes and
# constants. Nothing that does I/O (save, load, from_file), loads or compiles code (ops,
# library, jit, compile, hub, utils), reaches autograd or grad mode (autograd, func,
# enable_grad, set_grad_enabled, no_grad), the random generator or a device (cuda).
TORCH_FUNCTIONS = frozenset("""
abs absolute add sub subtract mul multiply div divide true_divide floor_divide remainder fmod neg negative reciprocal
pow float_power square sqrt rsqrt exp exp2 expm1 log log2 log10 log1p logaddexp logaddexp2 sin cos tan asin acos atan
atan2 arctan2 sinh cosh tanh sigmoid relu erf erfc erfinv sign sgn signbit floor ceil round trunc frac clamp clip
clamp_min clamp_max minimum maximum fmin fmax min max amin amax aminmax argmin argmax sum nansum mean nanmean prod
cumsum cumprod cummax cummin logcumsumexp logsumexp softmax log_softmax std var var_mean std_mean norm dist median
nanmedian quantile nanquantile mode sort argsort msort topk kthvalue where masked_fill lerp addcmul addcdiv matmul mm
bmm mv dot vdot inner outer einsum tensordot baddbmm addmm addmv kron trace cross zeros zeros_like ones ones_like full
full_like empty empty_like arange linspace logspace eye tensor as_tensor scalar_tensor cat concat concatenate stack
hstack vstack dstack column_stack split chunk tensor_split unbind reshape flatten unflatten squeeze unsqueeze transpose
permute movedim moveaxis swapaxes swapdims t narrow select index_select gather scatter scatter_add scatter_reduce take
take_along_dim masked_select broadcast_to broadcast_tensors broadcast_shapes flip fliplr flipud roll rot90 tril triu
diag diagonal diag_embed diff isnan isinf isfinite isposinf isneginf isreal nan_to_num eq ne lt le gt ge greater
greater_equal less less_equal not_equal equal allclose isclose logical_and logical_or logical_not logical_xor
bitwise_and bitwise_or bitwise_xor bitwise_not any all count_nonzero nonzero argwhere numel is_tensor
is_floating_point is_complex result_type promote_types can_cast heaviside xlogy hypot copysign repeat_interleave tile
bucketize searchsorted cdist clone unique unique_consecutive bincount histc deg2rad rad2deg
float16 float32 float64 bfloat16 half float double int8 int16 int32 int64 uint8 int long short bool complex64
complex128 inf nan pi e finfo iinfo Tensor Size dtype device
""".split())
# F.<name> (torch.nn.functional.<name>): activations, normalizations, losses, padding.
FUNCTIONAL_FUNCTIONS = frozenset("""
softmax log_softmax softmin relu relu6 gelu silu elu selu celu leaky_relu sigmoid logsigmoid tanh hardtanh
hardsigmoid hardswish softplus softsign mish glu threshold layer_norm rms_norm normalize pad linear bilinear one_hot
cosine_similarity pairwise_distance mse_loss l1_loss smooth_l1_loss huber_loss cross_entropy nll_loss
binary_cross_entropy binary_cross_entropy_with_logits kl_div
""".split())
LINALG_FUNCTIONS = frozenset("vector_norm matrix_norm norm vecdot matmul cross diagonal".split())
SPECIAL_FUNCTIONS = frozenset("expit logit erf erfc erfinv exp2 expm1 log1p logsumexp softmax log_softmax xlogy "
                              "xlog1py entr ndtr log_ndtr sinc round i0 gammaln digamma".split())
# Module paths an answer may go through to reach a function (never use as a value).
TORCH_NAMESPACES = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.special", "F",
                              "math"})
# A tensor's public names an answer may not use, whatever the exercise: hooks, storages and
# shared memory, callables run from C++ on each element, other classes and type strings.
TENSOR_DENIED = frozenset({
    "register_hook", "register_post_accumulate_grad_hook", "storage", "untyped_storage", "storage_type",
    "share_memory_", "is_shared", "module_load", "as_subclass", "type", "apply_", "map_", "map2_", "set_",
    "record_stream", "pin_memory", "reinforce",
})
# What autograd is reached by: refused by name where the exercise asks for the result without it.
AUTOGRAD_NAMES = frozenset({
    "backward", "grad", "grad_fn", "requires_grad", "requires_grad_", "retain_grad", "retains_grad", "is_leaf",
    "autograd", "func", "enable_grad", "set_grad_enabled", "no_grad", "inference_mode", "is_grad_enabled",
})
# What a PyTorch answer's statements and expressions may be.
TORCH_ALLOWED_NODES = ALLOWED_NODES + (
    ast.Lambda, ast.Delete, ast.Del, ast.NamedExpr, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp, ast.comprehension, ast.Starred, ast.JoinedStr, ast.FormattedValue,
)


def _torch_paths():
    """Every dotted ``module.name`` a PyTorch answer may use."""
    import math

    paths = {f"torch.{name}" for name in TORCH_FUNCTIONS}
    paths |= {f"{prefix}.{name}" for prefix in ("F", "torch.nn.functional") for name in FUNCTIONAL_FUNCTIONS}
    paths |= {f"torch.linalg.{name}" for name in LINALG_FUNCTIONS}
    paths |= {f"torch.special.{name}" for name in SPECIAL_FUNCTIONS}
    paths |= {f"math.{name}" for name in dir(math) if not name.startswith("_")}
    return paths


def _value_attributes():
    """Attribute names an answer may read off a value: the public names of a tensor, less
    TENSOR_DENIED, and those of its dtype, finfo/iinfo, device and size."""
    import torch

    names = set()
    for cls in (torch.Tensor, torch.dtype, torch.finfo, torch.iinfo, torch.Size, torch.device):
        names |= {name for name in dir(cls) if not name.startswith("_")}
    return (names | {"eps", "tiny", "max", "min", "bits", "resolution", "smallest_normal", "values", "indices"}) \
        - TENSOR_DENIED


def _module_chain(node):
    """["torch", "nn", "functional", ...] for an attribute chain on a module name, else None."""
    if isinstance(node, ast.Name):
        return [node.id] if node.id in TORCH_MODULES else None
    if isinstance(node, ast.Attribute):
        chain = _module_chain(node.value)
        return None if chain is None else chain + [node.attr]
    return None


def torch_definition(cells_source, name):
    """The source of the last top-level ``def name(...)`` among ``cells_source`` (the code
    cells of a returned notebook), or raise NotPyTorch saying what is there."""
    source = _last_definition(cells_source, name)
    if source is None:
        raise NotPyTorch(f"no top-level `def {name}(...)` in the notebook: the grader takes the answer from its "
                         "definition")
    return source


def check_torch_source(source, name, without_autograd=False):
    """Raise NotPyTorch, naming what it found, unless ``source`` is exactly one undecorated
    function ``name`` in the grader's PyTorch language (see the module's docstring);
    ``without_autograd``: autograd's names are refused too."""
    tree = ast.parse(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != name:
        raise NotPyTorch(f"the answer must be one function `{name}`")
    function = tree.body[0]
    paths, attributes = _torch_paths(), _value_attributes()
    nodes = list(ast.walk(function))
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    own = {node.arg for node in nodes if isinstance(node, ast.arg)}
    own |= {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del))}
    own |= {node.name for node in nodes if isinstance(node, ast.FunctionDef)}  # helpers defined inside it
    without = "the exercise asks for the result without autograd"
    for node in nodes:
        where = f"(line {getattr(node, 'lineno', function.lineno)})"
        if not isinstance(node, TORCH_ALLOWED_NODES):
            raise NotPyTorch(f"`{name}` uses {type(node).__name__} {where}, which a PyTorch answer does not need")
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            raise NotPyTorch(f"`{node.name}` is decorated {where}: the answer is a plain function")
        if isinstance(node, (ast.FunctionDef, ast.arg)):
            bound = node.name if isinstance(node, ast.FunctionDef) else node.arg
            if bound.startswith("_") and bound != "_":
                raise NotPyTorch(f"`{name}` names `{bound}` {where}: no name may begin with `_`")
            if bound in TORCH_MODULES:
                raise NotPyTorch(f"`{name}` binds `{bound}` {where}, which names a module")
        if isinstance(node, ast.Name):
            if node.id.startswith("_") and node.id != "_":
                raise NotPyTorch(f"`{name}` names `{node.id}` {where}: no name may begin with `_`")
            if node.id in TORCH_MODULES:
                if not isinstance(node.ctx, ast.Load):
                    raise NotPyTorch(f"`{name}` binds `{node.id}` {where}, which names a module")
                if not isinstance(parents.get(node), ast.Attribute):
                    raise NotPyTorch(f"`{name}` uses the module `{node.id}` {where} other than as "
                                     f"`{node.id}.<function>`")
            elif isinstance(node.ctx, ast.Load) and node.id not in own and node.id not in TORCH_BUILTINS:
                if hasattr(builtins, node.id):
                    raise NotPyTorch(f"`{name}` calls the builtin `{node.id}` {where}")
                raise NotPyTorch(f"`{name}` reads `{node.id}` {where}, which is neither its own nor torch, F or "
                                 "math: the grader takes the function alone")
        if isinstance(node, ast.Attribute):
            if not isinstance(node.ctx, ast.Load):
                raise NotPyTorch(f"`{name}` sets `.{node.attr}` {where}: an answer sets no attributes")
            if node.attr.startswith("_"):
                raise NotPyTorch(f"`{name}` reads `.{node.attr}` {where}: no attribute may begin with `_`")
            chain = _module_chain(node)
            if chain is None and without_autograd and node.attr in AUTOGRAD_NAMES:
                raise NotPyTorch(f"`{name}` uses `.{node.attr}` {where}: {without}")
            if chain is None:
                if node.attr not in attributes:
                    raise NotPyTorch(f"`{name}` reads `.{node.attr}` {where}, not an attribute of a tensor, dtype or "
                                     "size the grader allows")
                continue
            namespace = chain[0]
            for index, attribute in enumerate(chain[1:], start=1):
                path = f"{namespace}.{attribute}"
                if without_autograd and attribute in AUTOGRAD_NAMES:
                    raise NotPyTorch(f"`{name}` uses `{path}` {where}: {without}")
                if path in TORCH_NAMESPACES:
                    namespace = path
                elif path in paths:
                    rest = chain[index + 1:]  # read off the value the path names (torch.float64.itemsize)
                    refused = next((attribute for attribute in rest if without_autograd and attribute in AUTOGRAD_NAMES),
                                   None)
                    if refused is not None:
                        raise NotPyTorch(f"`{name}` uses `.{refused}` {where}: {without}")
                    refused = next((attribute for attribute in rest if attribute not in attributes), None)
                    if refused is not None:
                        raise NotPyTorch(f"`{name}` reads `.{refused}` {where}, not an attribute of a tensor, dtype "
                                         "or size the grader allows")
                    break
                else:
                    raise NotPyTorch(f"`{name}` uses `{path}` {where}, which is not on the grader's list of "
                                     "PyTorch functions")
            else:
                if not isinstance(parents.get(node), ast.Attribute):
                    raise NotPyTorch(f"`{name}` uses the module `{namespace}` {where} other than as "
                                     f"`{namespace}.<function>`")


def load_torch_function(source, name, folder, without_autograd=False):
    """The function defined by ``source`` (checked first), from a file of its own in
    ``folder``, in a module whose only names are ``torch``, ``F``, ``math`` and TORCH_BUILTINS."""
    import importlib.util
    import math
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    check_torch_source(source, name, without_autograd)
    path = Path(folder) / f"returned_{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"returned_{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(torch=torch, F=F, math=math,
                           __builtins__={name: getattr(builtins, name) for name in TORCH_BUILTINS})
    spec.loader.exec_module(module)
    return getattr(module, name)


def load_answer(entry, folder):
    """The answer of one entry of a spec: a kernel, or a PyTorch function (``"kind": "torch"``)."""
    if entry.get("kind", "kernel") == "torch":
        return load_torch_function(entry["source"], entry["name"], folder,
                                   without_autograd=entry["checker"] in WITHOUT_AUTOGRAD_CHECKERS)
    return load_kernel(entry["source"], entry["name"], folder)


def run_verdicts(package_dir, spec, secret, out=sys.stdout):
    """Run each checker of ``spec`` ({"seed", "kernels": [{grade_id, checker, name, source, kind}]},
    kind "kernel", the default, or "torch") on its answer, printing ``secret`` and the verdict
    as JSON, one line each."""
    import tempfile
    from pathlib import Path

    import torch

    fresh_checker = {"__name__": "course_lib_fresh_checker"}
    runner = Path(package_dir) / "teaching" / "fresh_checker.py"
    exec(compile(runner.read_text(encoding="utf-8"), str(runner), "exec"), fresh_checker)
    exercises = fresh_checker["load_fresh_exercises"](package_dir)
    seed = spec["seed"]
    exercises.common.set_hidden_sizes(seed is not None)
    with tempfile.TemporaryDirectory(prefix="course_lib_kernels_") as folder:
        for entry in spec["kernels"]:
            error = None
            try:
                answer = load_answer(entry, folder)
                if seed is not None:
                    torch.manual_seed(fresh_checker["variant_seed"](seed, entry["grade_id"]))
                getattr(exercises, entry["checker"])(answer)
            except Exception as failure:  # the checker's verdict, or why the answer could not be taken
                error = fresh_checker["_error_line"](failure)
            out.write(secret + json.dumps({"grade_id": entry["grade_id"], "passed": error is None, "error": error})
                      + "\n")
            out.flush()


def main(argv):
    package_dir, spec_path = argv
    secret = sys.stdin.readline().strip()  # read before any kernel runs, kept in this frame alone
    with open(spec_path, encoding="utf-8") as spec:
        run_verdicts(package_dir, json.load(spec), secret)


if __name__ == "__main__":
    main(sys.argv[1:])
