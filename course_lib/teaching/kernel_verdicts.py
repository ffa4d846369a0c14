"""Verdicts on returned answers from a process the return's code never runs in.

A checker that calls a student's Python in its own process can be reached from that code:
an answer can walk the stack up to the grader and write "passed" where results go. A
kernel exercise's answer is a ``@triton.jit`` function, and a Triton kernel needs no
Python but Triton's language. So grading takes each kernel checker's answer out of the
returned notebook *as source* (with the top-level ``@triton.jit`` helpers it calls; the
decorator may carry literal options such as ``do_not_specialize=[]``), checks that each
is one ``@triton.jit`` function written in Triton's language alone (no imports, no names
beginning with ``__``, no attribute but ``tl``'s and a tensor's, a few harmless builtins),
and runs the released checker on it in a fresh process (:func:`main`) that holds nothing
of the notebook. That process prints
each verdict after a secret the grader gives it on stdin, which the kernel cannot read:
a line the kernel writes to stdout without it counts for nothing.

The PyTorch exercises' answers are judged the same way, in the PyTorch language of
torch_verdicts.py.

Exercise 5.3 (two kernels made an operator with ``torch.library``: OPERATOR_CHECKERS) is
judged here too. Its two kernels are taken as kernels; the operator from the last cell that
defines it at its top level (:func:`operator_definition`, the kernels blanked out), whose
top-level statements may be only functions, assignments to names, expressions and ``if``s,
in that PyTorch language extended by exactly what the stub and the solution use
(:func:`check_operator_source`): ``torch.library.triton_op``/``custom_op`` as the one
decorator of a function (directly, or through a name, the stub's ``as_operator``, bound to
them alone and used for nothing else), with one ``"namespace::name"`` string in a namespace
holding no operators yet and ``mutates_args``; ``torch.library.wrap_triton``,
``triton.cdiv``, ``runtime.ON_GPU``/``DEVICE``, the kernels by name, and the attributes
OPERATOR_ATTRIBUTES (registrations, the autograd context's saved tensors). The cell runs in a
module whose only names are those, from a file of its own.

This file is run by path, from a fresh copy of the package, in Python's isolated mode and in a
sandbox (course_lib.teaching.grading.sandbox): ``python -I kernel_verdicts.py PACKAGE_DIR SPEC_JSON``
with the secret on stdin. ``-I`` keeps this file's folder off ``sys.path``, so nothing planted
beside it is imported: its own modules, ``answer_source`` and ``torch_verdicts``, come from
PACKAGE_DIR's ``teaching``, imported under a package name nothing else uses.
"""

import ast
import builtins
import json
import sys


def _teaching_of_copy(package_dir):
    """The name of ``teaching`` in the package copy ``package_dir``, imported under a package name
    nothing else uses, as fresh_checker imports the exercises."""
    import types
    import uuid

    name = f"_course_lib_verdicts_{uuid.uuid4().hex}"
    package = types.ModuleType(name)
    package.__path__ = [str(package_dir)]
    sys.modules[name] = package
    return f"{name}.teaching"


if not __package__:  # run by path: its siblings are those of PACKAGE_DIR, the copy (PEP 366's __package__)
    __package__ = _teaching_of_copy(sys.argv[1])

from .answer_source import ALLOWED_NODES, first_line, last_definition, last_top_level_def, run_as_module
from .torch_verdicts import (TORCH_BUILTINS, TORCH_MODULES, TORCH_NAMESPACES, WITHOUT_AUTOGRAD_CHECKERS, NotPyTorch,
                             check_pytorch_nodes, load_torch_function, own_names, torch_paths, value_attributes)

JIT_DECORATOR = "triton.jit"
# Options of @triton.jit(...) a kernel may give, as literals.
JIT_OPTIONS = ("do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline")
# Builtins a kernel may call (the rest, __import__, open, getattr, eval..., are not there).
KERNEL_BUILTINS = ("range", "min", "max", "abs", "int", "float", "bool", "len", "print", "isinstance", "tuple")


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

    return {name for name in dir(tl)
            if not name.startswith("_") and not isinstance(getattr(tl, name), types.ModuleType)}


def kernel_definition(cells_source, name):
    """The source of the last top-level ``@triton.jit def name(...)`` among ``cells_source``
    (the code cells of a returned notebook), preceded by the top-level ``@triton.jit``
    helpers it calls (and those they call), or raise NotAKernel saying what is there."""
    source = last_definition(cells_source, name)
    if source is None:
        raise NotAKernel(f"no top-level `@triton.jit def {name}(...)` in the notebook: the grader takes the kernel "
                         "from its definition")
    helpers, pending, seen = [], [source], {name}
    while pending:
        for called in _called_names(pending.pop()):
            if called in seen:
                continue
            seen.add(called)
            found = last_top_level_def(cells_source, called)
            if found is not None and any(_is_jit_decorator(d) for d in found[2].decorator_list):
                helper = last_definition(cells_source, called)
                helpers.insert(0, helper)
                pending.append(helper)
    return "\n".join(helpers + [source])


def _called_names(source):
    """The plain names called in ``source`` (``helper(x)``, not ``tl.load(x)``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return sorted({node.func.id for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)})


def _is_jit_decorator(decorator):
    """``@triton.jit``, or ``@triton.jit(option=literal, ...)`` with options of JIT_OPTIONS."""
    if ast.unparse(decorator) == JIT_DECORATOR:
        return True
    if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == JIT_DECORATOR) or decorator.args:
        return False
    for keyword in decorator.keywords:
        if keyword.arg not in JIT_OPTIONS:
            return False
        try:
            ast.literal_eval(keyword.value)
        except Exception:  # not a literal: a name, a call, a lambda
            return False
    return True


def check_kernel_source(source, name):
    """Raise NotAKernel unless ``source`` is the function ``name`` decorated ``@triton.jit``
    (or ``@triton.jit(...)`` with literal options of JIT_OPTIONS), after the ``@triton.jit``
    helpers it calls, each written in Triton's language alone."""
    tree = ast.parse(source)
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if (len(functions) != len(tree.body) or not functions or functions[-1].name != name
            or len({f.name for f in functions}) != len(functions)):
        raise NotAKernel(f"the answer must be one function `{name}` (after the @triton.jit helpers it calls)")
    for function in functions:
        _check_kernel_function(function)


def _check_kernel_function(function):
    """Raise NotAKernel unless ``function`` is decorated ``@triton.jit`` alone and its body
    uses Triton's language alone."""
    name = function.name
    if len(function.decorator_list) != 1 or not _is_jit_decorator(function.decorator_list[0]):
        raise NotAKernel(f"`{name}` must be decorated `@{JIT_DECORATOR}` and nothing else (options such as "
                         f"do_not_specialize=[...] given as literals)")
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
    import triton
    import triton.language as tl

    check_kernel_source(source, name)
    return run_as_module(source, name, folder, dict(triton=triton, tl=tl), KERNEL_BUILTINS)


# --- an operator of torch.library (exercise 5.3) ------------------------------------------

# The checkers that take an operator made of the student's kernels: (kernel, kernel, operator).
OPERATOR_CHECKERS = frozenset({"check_scale_columns_op"})
# The names an operator's cell reads besides its own, the kernels and TORCH_MODULES: triton (for
# triton.cdiv) and course_lib.core.runtime (for runtime.ON_GPU, as the stub does).
OPERATOR_MODULES = TORCH_MODULES + ("triton", "runtime")
# What of them it may use: the makers of an operator (only as a decorator, or named by an
# assignment whose name is only used as one), the launch of a kernel through wrap_triton,
# triton.cdiv and where the notebook runs.
OPERATOR_MAKERS = frozenset({"torch.library.triton_op", "torch.library.custom_op"})
OPERATOR_PATHS = OPERATOR_MAKERS | {"torch.library.wrap_triton", "triton.cdiv", "runtime.ON_GPU", "runtime.DEVICE"}
# The attributes it may read off its values besides a tensor's: an operator's registrations, and
# the autograd context's saved tensors (setup_context and backward).
OPERATOR_ATTRIBUTES = frozenset({"register_autograd", "register_fake", "save_for_backward", "saved_tensors",
                                 "needs_input_grad"})
# An operator's statements at the top of its cell.
OPERATOR_STATEMENTS = (ast.FunctionDef, ast.Assign, ast.Expr, ast.If, ast.Pass)
# Namespaces an operator may not be made in (besides those that hold operators already).
RESERVED_NAMESPACES = frozenset({"aten", "prim", "prims", "torch", "course_lib", "inductor", "higher_order"})


def operator_definition(cells_source, kernel_names, name):
    """The cell that defines the operator ``name`` last (the top-level ``def name`` decorated
    by its maker), its top-level definitions of ``kernel_names`` (taken on their own, as
    kernels) blanked out, or raise NotPyTorch saying what is there. Its lines keep their
    numbers in the cell."""
    found = last_top_level_def(cells_source, name)
    if found is None:
        raise NotPyTorch(f"no top-level `def {name}(...)` in the notebook: the grader takes the operator from the "
                         "cell that defines it")
    source, tree, _ = found
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in kernel_names:
            first = first_line(node)
            lines[first - 1:node.end_lineno] = [""] * (node.end_lineno - first + 1)
    return "\n".join(lines) + "\n"


def _namespaces_in_use():
    """The namespaces that hold operators already (aten, prims, course_lib...)."""
    import torch

    return {qualified.split("::")[0] for qualified in torch._C._dispatch_get_all_op_names()} | RESERVED_NAMESPACES


def _check_maker_call(call, label, where):
    """Raise NotPyTorch unless ``call`` makes an operator as the stub does:
    ``maker("namespace::name", mutates_args=(...))``, in a namespace of its own."""
    import re

    if len(call.args) != 1 or not isinstance(call.args[0], ast.Constant) or not isinstance(call.args[0].value, str):
        raise NotPyTorch(f"{label} makes an operator {where} without naming it by one string, as the stub does "
                         "(\"chapter5::scale_columns\")")
    qualified = call.args[0].value
    match = re.fullmatch(r"([a-z][a-z0-9_]*)::([A-Za-z][A-Za-z0-9_]*)", qualified)
    if match is None:
        raise NotPyTorch(f"{label} makes the operator {qualified!r} {where}: name it \"namespace::name\"")
    if match.group(1) in _namespaces_in_use():
        raise NotPyTorch(f"{label} makes the operator {qualified!r} {where} in the namespace {match.group(1)!r}, "
                         "which holds operators already")
    for keyword in call.keywords:
        mutates = isinstance(keyword.value, (ast.Tuple, ast.List)) and all(
            isinstance(element, ast.Constant) and isinstance(element.value, str) for element in keyword.value.elts)
        if keyword.arg != "mutates_args" or not mutates:
            raise NotPyTorch(f"{label} makes an operator {where} with `{keyword.arg or '**'}=`: only "
                             "mutates_args=(...) of names is taken")


def _maker_leaves(value):
    """The makers ``value`` chooses between (``maker``, ``maker if test else maker``...), or None
    when it is anything else."""
    if isinstance(value, ast.IfExp):
        body, orelse = _maker_leaves(value.body), _maker_leaves(value.orelse)
        return None if body is None or orelse is None else body + orelse
    return [value] if isinstance(value, ast.Attribute) and ast.unparse(value) in OPERATOR_MAKERS else None


def check_operator_source(source, kernel_names, name):
    """Raise NotPyTorch, naming what it found, unless ``source`` (the cell of the operator
    ``name``, :func:`operator_definition`) is statements of the stub's kinds in the grader's
    PyTorch language, extended by OPERATOR_PATHS, OPERATOR_ATTRIBUTES and the kernels
    ``kernel_names`` (read, never bound): functions, decorated only by an operator's maker;
    assignments to names; expressions (the registrations); ``if``s of those."""
    tree = ast.parse(source)
    label = f"the cell of `{name}`"
    statements, pending = [], list(tree.body)
    while pending:  # the top-level statements, those of top-level ifs included
        statement = pending.pop(0)
        where = f"(line {statement.lineno})"
        if not isinstance(statement, OPERATOR_STATEMENTS):
            raise NotPyTorch(f"{label} uses {type(statement).__name__} {where}, which building the operator does "
                             "not need")
        if isinstance(statement, ast.Assign) and not all(isinstance(target, ast.Name) for target in statement.targets):
            raise NotPyTorch(f"{label} assigns to {ast.unparse(statement.targets[0])} {where}: only names are bound")
        if isinstance(statement, ast.If):
            pending = statement.body + statement.orelse + pending
        statements.append(statement)
    if not any(isinstance(statement, ast.FunctionDef) and statement.name == name for statement in statements):
        raise NotPyTorch(f"{label} does not define `{name}` at its top level")
    nodes = list(ast.walk(tree))
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    # The names an operator's maker is assigned to, as the stub's
    # as_operator = torch.library.triton_op if runtime.ON_GPU else torch.library.custom_op.
    makers, maker_values = set(), set()
    for statement in statements:
        leaves = _maker_leaves(statement.value) if isinstance(statement, ast.Assign) else None
        if leaves:
            makers |= {target.id for target in statement.targets}
            maker_values |= {id(node) for leaf in leaves for node in ast.walk(leaf)}
    decorated, decorator_calls = set(), set()
    for statement in statements:
        if isinstance(statement, ast.FunctionDef) and statement.decorator_list:
            where = f"(line {statement.lineno})"
            if len(statement.decorator_list) != 1:
                raise NotPyTorch(f"`{statement.name}` has {len(statement.decorator_list)} decorators {where}: an "
                                 "operator has one, its maker")
            call = statement.decorator_list[0]
            if not isinstance(call, ast.Call) or (ast.unparse(call.func) not in OPERATOR_MAKERS
                                                  and ast.unparse(call.func) not in makers):
                raise NotPyTorch(f"`{statement.name}` is decorated @{ast.unparse(call)} {where}: a function of the "
                                 "cell is plain, or an operator made by torch.library.triton_op or custom_op")
            _check_maker_call(call, f"`{statement.name}`", where)
            decorated.add(statement)
            decorator_calls.add(id(call.func))
    for node in nodes:  # a maker makes only the operators of decorators checked above
        is_maker = (isinstance(node, ast.Attribute) and ast.unparse(node) in OPERATOR_MAKERS) or (
            isinstance(node, ast.Name) and node.id in makers and isinstance(node.ctx, ast.Load))
        if is_maker and id(node) not in decorator_calls and id(node) not in maker_values:
            raise NotPyTorch(f"{label} uses `{ast.unparse(node)}` (line {node.lineno}) other than as the decorator "
                             "of an operator")
        if isinstance(node, ast.Name) and node.id in makers and not isinstance(node.ctx, ast.Load) \
                and not isinstance(parents.get(node), ast.Assign):
            raise NotPyTorch(f"{label} binds `{node.id}` (line {node.lineno}) other than by an assignment")
    check_pytorch_nodes(nodes, label, own_names(nodes), 1, modules=OPERATOR_MODULES,
                        paths=torch_paths() | OPERATOR_PATHS, attributes=value_attributes() | OPERATOR_ATTRIBUTES,
                        known=frozenset(kernel_names), decorated=frozenset(decorated),
                        namespaces=TORCH_NAMESPACES | {"torch.library"})


def _imported_modules_only(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` for the operator's module: the modules imported already, and no others."""
    if level != 0 or name not in sys.modules:
        raise ImportError(f"the operator's module imports nothing ({name!r})")
    return builtins.__import__(name, globals, locals, fromlist, level)


def load_operator(sources, names, folder, runtime):
    """[kernel, kernel, operator]: the two kernels ``names[:2]`` (checked as kernels) and the
    operator ``names[2]`` built by its cell (checked by :func:`check_operator_source`), run
    from a file of its own in a module whose only names are the kernels, ``torch``, ``F``,
    ``math``, ``triton``, ``runtime`` and TORCH_BUILTINS."""
    import math

    import torch
    import torch.nn.functional as F
    import triton

    kernels = [load_kernel(source, name, folder) for source, name in zip(sources[:2], names[:2])]
    name = names[2]
    check_operator_source(sources[2], names[:2], name)
    # torch's C code imports through the builtins of the frame it runs in (a fake implementation's,
    # new_empty on a fake tensor): it finds modules imported already, never others. No answer names
    # it (no name begins with `_`).
    operator = run_as_module(sources[2], name, folder,
                             dict(zip(names[:2], kernels), torch=torch, F=F, math=math, triton=triton, runtime=runtime),
                             TORCH_BUILTINS, {"__import__": _imported_modules_only})
    return [*kernels, operator]


def load_answer(entry, folder, runtime=None):
    """The answers of one entry of a spec, as the checker's arguments: a kernel, a PyTorch
    function (``"kind": "torch"``), or two kernels and their operator (``"kind": "operator"``,
    ``names`` and ``sources`` for ``name`` and ``source``)."""
    kind = entry.get("kind", "kernel")
    if kind == "operator":
        return load_operator(entry["sources"], entry["names"], folder, runtime)
    if kind == "torch":
        return [load_torch_function(entry["source"], entry["name"], folder,
                                    without_autograd=entry["checker"] in WITHOUT_AUTOGRAD_CHECKERS)]
    return [load_kernel(entry["source"], entry["name"], folder)]


def run_verdicts(package_dir, spec, secret, out=sys.stdout):
    """Run each checker of ``spec`` ({"seed", "kernels": [{grade_id, checker, name, source, kind}]},
    kind "kernel", the default, "torch", or "operator" with names and sources) on its answers,
    printing ``secret`` and the verdict as JSON, one line each."""
    import importlib
    import tempfile
    from pathlib import Path

    import torch

    fresh_checker = {"__name__": "course_lib_fresh_checker"}
    runner = Path(package_dir) / "teaching" / "fresh_checker.py"
    exec(compile(runner.read_text(encoding="utf-8"), str(runner), "exec"), fresh_checker)
    exercises = fresh_checker["load_fresh_exercises"](package_dir)
    seed = spec["seed"]
    exercises.common.set_hidden_sizes(seed is not None)
    runtime = importlib.import_module(exercises.__name__.split(".")[0] + ".core.runtime")  # the checkers' own
    with tempfile.TemporaryDirectory(prefix="course_lib_kernels_") as folder:
        for entry in spec["kernels"]:
            error = message = None
            try:
                answers = load_answer(entry, folder, runtime)
                if seed is not None:
                    torch.manual_seed(fresh_checker["variant_seed"](seed, entry["grade_id"]))
                getattr(exercises, entry["checker"])(*answers)
            except Exception as failure:  # the checker's verdict, or why the answer could not be taken
                error, message = fresh_checker["_error_line"](failure), fresh_checker["_message"](failure)
            out.write(secret + json.dumps({"grade_id": entry["grade_id"], "passed": error is None, "error": error,
                                           "message": message})
                      + "\n")
            out.flush()


def main(argv):
    package_dir, spec_path = argv
    secret = sys.stdin.readline().strip()  # read before any kernel runs, kept in this frame alone
    with open(spec_path, encoding="utf-8") as spec:
        run_verdicts(package_dir, json.load(spec), secret)


if __name__ == "__main__":
    main(sys.argv[1:])
