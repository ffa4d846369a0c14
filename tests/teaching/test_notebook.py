import triton
import triton.language as tl

from course_lib.core import references
import pytest
import torch

from course_lib.teaching.notebook import (GLUE_MIME_PREFIX, ClaimContradicted, claim, draw_timeline, excerpt_of, glue,
                                          host_and_gpu_events, section_of, show_source, source_of)
from course_lib.kernels.weighted_sum_op import weighted_sum_forward_kernel


def test_source_of_plain_function():
    assert source_of(references.weighted_sum).startswith("def weighted_sum(x, weight):")


def test_source_of_triton_kernel_in_either_runtime():
    assert "@triton.jit" in source_of(weighted_sum_forward_kernel)
    assert "def weighted_sum_forward_kernel(" in source_of(weighted_sum_forward_kernel)


def test_show_source_prints_each(capsys):
    @triton.jit
    def tiny_kernel(x_ptr, BLOCK: tl.constexpr):
        pass

    show_source(references.weighted_sum, tiny_kernel)
    out = capsys.readouterr().out
    assert "def weighted_sum(" in out and "def tiny_kernel(" in out


def test_section_of_a_module_stops_at_the_next_rule():
    from course_lib.kernels.layernorm_op import whole_rows as layernorm_module

    section = section_of(layernorm_module, "custom operator")
    assert section.startswith("# ---") and "@differentiable_op(" in section and "def LAYERNORM(" in section
    assert "class LayerNormFunction" not in section and "def layernorm(" not in section
    with pytest.raises(ValueError, match="no section 'nonsense'"):
        section_of(layernorm_module, "nonsense")


def test_timeline_of_a_profiled_step_has_host_rows_and_draws():
    import matplotlib

    matplotlib.use("Agg")
    x = torch.randn(64, 32, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with torch.profiler.record_function("step"):
                (x * 2).sum().backward()
    events = host_and_gpu_events(prof)
    assert events and all(row.startswith("host thread") for row, *_ in events)
    assert any("mul" in name for _, name, _, _ in events)
    starts = [start for _, _, start, _ in events]
    assert starts == sorted(starts) and min(starts) >= 0
    ax = draw_timeline(events + [("GPU", "kernel", 1.0, 5.0)], title="one step")
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "GPU"
    with pytest.raises(ValueError, match="record_function"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as bare:
            x.sum()
        host_and_gpu_events(bare)


def test_glue_writes_what_myst_nb_reads_and_shows_nothing(monkeypatch):
    pytest.importorskip("IPython", reason="glue runs in notebooks, where IPython is; the package does not need it")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw, metadata: shown.append((data, metadata)))
    assert glue("ch0_speed", 0.9349, ".2f") is None
    assert shown == [({GLUE_MIME_PREFIX + "text/plain": "'0.93'"},
                      {"scrapbook": {"name": "ch0_speed", "mime_prefix": GLUE_MIME_PREFIX}})]


def test_glued_numbers_keep_their_trailing_zeros_in_the_book(monkeypatch):
    pytest.importorskip("IPython", reason="glue runs in notebooks, where IPython is; the package does not need it")
    pytest.importorskip("myst_nb", reason="the book's renderer; make book installs it")
    from myst_nb.core.variables import format_plain_text  # what {glue:text} renders with

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw, metadata: shown.append(data))
    for value, fmt, expected in [(0.4, ".2f", "0.40"), (3.0, ".1f", "3.0"), (12, None, "12"), ("H200", None, "H200")]:
        glue("ch0_value", value, fmt)
        assert format_plain_text(shown[-1][GLUE_MIME_PREFIX + "text/plain"], "") == expected
    for fmt in (None, ".2g", "g"):
        with pytest.raises(ValueError, match="fixed-point"):
            glue("ch0_value", 0.4, fmt)


def test_claim_quotes_the_sentence_the_data_turns_over():
    claim("A beats B", True)
    with pytest.raises(ClaimContradicted, match=r"the chapter says 'A beats B', but this run's data does not: 3 > 2"):
        claim("A beats B", False, evidence="3 > 2")


def test_an_excerpt_is_cut_by_its_markers_and_a_drifted_marker_raises():
    from course_lib.kernels.weighted_sum_op import weighted_sum_forward_kernel

    excerpt = excerpt_of(weighted_sum_forward_kernel, "y = tl.sum(acc", "tl.store(")
    assert excerpt.splitlines()[0].strip().startswith("y = tl.sum(acc") and "tl.store(" in excerpt.splitlines()[-1]
    block = excerpt_of(references.weighted_sum, "def weighted_sum")
    assert block.startswith("def weighted_sum(") and block.rstrip().endswith("return (x * weight).sum(dim=-1)")
    with pytest.raises(ValueError, match="contains 'no such line'"):
        excerpt_of(weighted_sum_forward_kernel, "no such line")
    with pytest.raises(ValueError, match="no line after"):
        excerpt_of(weighted_sum_forward_kernel, "y = tl.sum(acc", "no such end")


def test_code_folded_to_the_books_column_is_the_same_code():
    """fit_code (what show_source and friends print) changes only the layout: every module of
    the package folds to the same syntax tree (strings' inner spacing aside), and what it can
    fold fits 88 characters."""
    import ast
    import importlib
    import inspect
    import pkgutil

    import course_lib
    from course_lib.teaching.notebook import fit_code, fit_line

    def tree(source):
        parsed = ast.parse(source)
        for node in ast.walk(parsed):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                node.value = " ".join(node.value.split())
        return ast.dump(parsed)

    for info in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        source = inspect.getsource(importlib.import_module(info.name))
        assert tree(fit_code(source)) == tree(source), info.name
    comment = fit_line("    # " + "word " * 30)
    assert len(comment) > 1 and all(len(line) <= 88 and line.startswith("    # ") for line in comment)
    folded = fit_code("from a import " + ", ".join(f"name{i}" for i in range(20)))
    assert all(len(line) <= 88 for line in folded.splitlines()) and ast.parse(folded)
