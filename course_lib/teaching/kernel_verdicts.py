"""Verdicts on returned kernels from a process the return's code never runs in.

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


def kernel_definition(cells_source, name):
    """The source of the last top-level ``@triton.jit def name(...)`` among ``cells_source``
    (the code cells of a returned notebook), or raise NotAKernel saying what is there."""
    found = None
    for source in cells_source:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # a cell that is not Python (a magic): it defines no kernel
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found = (source, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(target, ast.Name) and target.id == name
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                found = None  # a later assignment replaces the function
    if found is None:
        raise NotAKernel(f"no top-level `@triton.jit def {name}(...)` in the notebook: the grader takes the kernel "
                         "from its definition")
    source, node = found
    lines = source.splitlines()
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    return "\n".join(lines[first - 1:node.end_lineno]) + "\n"


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


def run_verdicts(package_dir, spec, secret, out=sys.stdout):
    """Run each checker of ``spec`` ({"seed", "kernels": [{grade_id, checker, name, source}]})
    on its kernel, printing ``secret`` and the verdict as JSON, one line each."""
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
                kernel = load_kernel(entry["source"], entry["name"], folder)
                if seed is not None:
                    torch.manual_seed(fresh_checker["variant_seed"](seed, entry["grade_id"]))
                getattr(exercises, entry["checker"])(kernel)
            except Exception as failure:  # the checker's verdict, or why the kernel could not be taken
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
