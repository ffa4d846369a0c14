"""A returned notebook's answer taken as source, and run once checked: what the verdicts on
kernels (kernel_verdicts.py) and on PyTorch answers (torch_verdicts.py) share."""

import ast
import builtins

# What a kernel's statements and expressions may be: Triton's language, no Python beyond it.
# A PyTorch answer's are these and a few more (torch_verdicts.TORCH_ALLOWED_NODES).
ALLOWED_NODES = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign,
    ast.For, ast.While, ast.If, ast.IfExp, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.keyword,
    ast.Attribute, ast.Name, ast.Constant, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Return, ast.Pass,
    ast.Break, ast.Continue, ast.Load, ast.Store, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context,
    ast.Assert,
)


def last_top_level_def(cells_source, name):
    """(cell source, its tree, the node) of the last top-level ``def name(...)`` among
    ``cells_source``, or None (none, or a later top-level assignment replaces it)."""
    found = None
    for source in cells_source:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # a cell that is not Python (a magic): it defines no function
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found = (source, tree, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(target, ast.Name) and target.id == name
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                found = None  # a later assignment replaces the function
    return found


def first_line(node):
    """The line a definition starts on, its decorators included."""
    return min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])


def last_definition(cells_source, name):
    """The source of the last top-level ``def name(...)`` among ``cells_source``, its
    decorators included, or None (none, or a later top-level assignment replaces it)."""
    found = last_top_level_def(cells_source, name)
    if found is None:
        return None
    source, _, node = found
    return "\n".join(source.splitlines()[first_line(node) - 1:node.end_lineno]) + "\n"



def run_as_module(source, name, folder, names, allowed_builtins, extra_builtins=None):
    """``name`` as defined by ``source`` (checked already), run from a file of its own in
    ``folder`` (Triton reads a kernel's source from its file), in a module whose only names
    are ``names`` and the builtins ``allowed_builtins`` (and ``extra_builtins``, a dict)."""
    import importlib.util
    from pathlib import Path

    path = Path(folder) / f"returned_{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"returned_{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(names, __builtins__={builtin: getattr(builtins, builtin) for builtin in allowed_builtins}
                           | (extra_builtins or {}))
    spec.loader.exec_module(module)
    return getattr(module, name)
