"""Verdicts on the answers of the PyTorch exercises, judged as kernel_verdicts.py judges kernels.

The PyTorch exercises (1.2, 3.2, 4.1 and 5.1: an ``Exercise`` with ``kernel=False`` whose
checker cell hands one name to its checker) are judged as the kernels are: taken out of the
returned notebook as source and run by their checker in kernel_verdicts.py's fresh process,
whose verdicts carry a secret. Their answer is one
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
"""

import ast
import builtins

from .answer_source import ALLOWED_NODES, last_definition, run_as_module


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


def torch_paths():
    """Every dotted ``module.name`` a PyTorch answer may use."""
    import math

    paths = {f"torch.{name}" for name in TORCH_FUNCTIONS}
    paths |= {f"{prefix}.{name}" for prefix in ("F", "torch.nn.functional") for name in FUNCTIONAL_FUNCTIONS}
    paths |= {f"torch.linalg.{name}" for name in LINALG_FUNCTIONS}
    paths |= {f"torch.special.{name}" for name in SPECIAL_FUNCTIONS}
    paths |= {f"math.{name}" for name in dir(math) if not name.startswith("_")}
    return paths


def value_attributes():
    """Attribute names an answer may read off a value: the public names of a tensor, less
    TENSOR_DENIED, and those of its dtype, finfo/iinfo, device and size."""
    import torch

    names = set()
    for cls in (torch.Tensor, torch.dtype, torch.finfo, torch.iinfo, torch.Size, torch.device):
        names |= {name for name in dir(cls) if not name.startswith("_")}
    return (names | {"eps", "tiny", "max", "min", "bits", "resolution", "smallest_normal", "values", "indices"}) \
        - TENSOR_DENIED


def _module_chain(node, modules=TORCH_MODULES):
    """["torch", "nn", "functional", ...] for an attribute chain on a module name, else None."""
    if isinstance(node, ast.Name):
        return [node.id] if node.id in modules else None
    if isinstance(node, ast.Attribute):
        chain = _module_chain(node.value, modules)
        return None if chain is None else chain + [node.attr]
    return None


def torch_definition(cells_source, name):
    """The source of the last top-level ``def name(...)`` among ``cells_source`` (the code
    cells of a returned notebook), or raise NotPyTorch saying what is there."""
    source = last_definition(cells_source, name)
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
    nodes = list(ast.walk(function))
    check_pytorch_nodes(nodes, f"`{name}`", own_names(nodes), function.lineno, without_autograd=without_autograd)


def own_names(nodes):
    """The names ``nodes`` bind: arguments, assignment targets, functions defined."""
    own = {node.arg for node in nodes if isinstance(node, ast.arg)}
    own |= {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del))}
    own |= {node.name for node in nodes if isinstance(node, ast.FunctionDef)}  # helpers defined inside it
    return own


def check_pytorch_nodes(nodes, label, own, first_line, without_autograd=False, modules=TORCH_MODULES, paths=None,
                        attributes=None, known=frozenset(), decorated=frozenset(), namespaces=TORCH_NAMESPACES):
    """Raise NotPyTorch unless every node of ``nodes`` (all the nodes of a tree) is in the
    grader's PyTorch language: reading ``own`` names, ``known`` ones (never bound), those of
    ``modules`` through ``paths`` and ``attributes`` off values. ``label`` names the code in
    messages; ``decorated``: the functions whose decorators were checked already."""
    paths = torch_paths() if paths is None else paths
    attributes = value_attributes() if attributes is None else attributes
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    without = "the exercise asks for the result without autograd"
    module_names = ", ".join(modules[:-1]) + " or " + modules[-1]

    def refuse_value_attributes(read, where):
        """Raise unless every attribute ``read`` off a value (x.sum, torch.float64.itemsize) is allowed."""
        refused = next((attribute for attribute in read if without_autograd and attribute in AUTOGRAD_NAMES), None)
        if refused is not None:
            raise NotPyTorch(f"{label} uses `.{refused}` {where}: {without}")
        refused = next((attribute for attribute in read if attribute not in attributes), None)
        if refused is not None:
            raise NotPyTorch(f"{label} reads `.{refused}` {where}, not an attribute of a tensor, dtype or size the "
                             "grader allows")
    for node in nodes:
        where = f"(line {getattr(node, 'lineno', first_line)})"
        if not isinstance(node, TORCH_ALLOWED_NODES):
            raise NotPyTorch(f"{label} uses {type(node).__name__} {where}, which a PyTorch answer does not need")
        if isinstance(node, ast.FunctionDef) and node.decorator_list and node not in decorated:
            raise NotPyTorch(f"`{node.name}` is decorated {where}: the answer is a plain function")
        if isinstance(node, (ast.FunctionDef, ast.arg)):
            bound = node.name if isinstance(node, ast.FunctionDef) else node.arg
            if bound.startswith("_") and bound != "_":
                raise NotPyTorch(f"{label} names `{bound}` {where}: no name may begin with `_`")
            if bound in modules or bound in known:
                raise NotPyTorch(f"{label} binds `{bound}` {where}, which names a "
                                 f"{'module' if bound in modules else 'kernel'}")
        if isinstance(node, ast.Name):
            if node.id.startswith("_") and node.id != "_":
                raise NotPyTorch(f"{label} names `{node.id}` {where}: no name may begin with `_`")
            if node.id in modules:
                if not isinstance(node.ctx, ast.Load):
                    raise NotPyTorch(f"{label} binds `{node.id}` {where}, which names a module")
                if not isinstance(parents.get(node), ast.Attribute):
                    raise NotPyTorch(f"{label} uses the module `{node.id}` {where} other than as "
                                     f"`{node.id}.<function>`")
            elif node.id in known:
                if not isinstance(node.ctx, ast.Load):
                    raise NotPyTorch(f"{label} binds `{node.id}` {where}, which names a kernel")
            elif isinstance(node.ctx, ast.Load) and node.id not in own and node.id not in TORCH_BUILTINS:
                if hasattr(builtins, node.id):
                    raise NotPyTorch(f"{label} calls the builtin `{node.id}` {where}")
                raise NotPyTorch(f"{label} reads `{node.id}` {where}, which is neither its own nor {module_names}: "
                                 "the grader takes the function alone")
        if isinstance(node, ast.Attribute):
            if not isinstance(node.ctx, ast.Load):
                raise NotPyTorch(f"{label} sets `.{node.attr}` {where}: an answer sets no attributes")
            if node.attr.startswith("_"):
                raise NotPyTorch(f"{label} reads `.{node.attr}` {where}: no attribute may begin with `_`")
            chain = _module_chain(node, modules)
            if chain is None:
                refuse_value_attributes([node.attr], where)
                continue
            namespace = chain[0]
            for index, attribute in enumerate(chain[1:], start=1):
                path = f"{namespace}.{attribute}"
                if without_autograd and attribute in AUTOGRAD_NAMES:
                    raise NotPyTorch(f"{label} uses `{path}` {where}: {without}")
                if path in namespaces:
                    namespace = path
                elif path in paths:
                    refuse_value_attributes(chain[index + 1:], where)  # read off the value the path names
                    break
                else:
                    raise NotPyTorch(f"{label} uses `{path}` {where}, which is not on the grader's list of "
                                     "PyTorch functions")
            else:
                if not isinstance(parents.get(node), ast.Attribute):
                    raise NotPyTorch(f"{label} uses the module `{namespace}` {where} other than as "
                                     f"`{namespace}.<function>`")


def load_torch_function(source, name, folder, without_autograd=False):
    """The function defined by ``source`` (checked first), from a file of its own in
    ``folder``, in a module whose only names are ``torch``, ``F``, ``math`` and TORCH_BUILTINS."""
    import math

    import torch
    import torch.nn.functional as F

    check_torch_source(source, name, without_autograd)
    return run_as_module(source, name, folder, dict(torch=torch, F=F, math=math), TORCH_BUILTINS)
