"""The kernel registry (course_lib/registry.py) against the files it names, and the places
that read it instead of listing kernels themselves."""

import importlib
import inspect
from pathlib import Path

import pytest

import course_lib
from course_lib.core import references
from course_lib.registry import BY_NAME, KERNELS, kernel_of_result

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.name)
def test_each_entry_names_files_that_exist(kernel):
    module = kernel.load()
    for name in kernel.functions:
        assert getattr(course_lib, name) is getattr(module, name), f"course_lib.{name} is not {kernel.module}'s"
        assert name in course_lib.__all__
    for name in kernel.references:
        assert callable(getattr(references, name)), f"course_lib.core.references has no {name}"
    assert (ROOT / kernel.test).is_file(), kernel.test
    benchmark = importlib.import_module(kernel.benchmark)
    assert callable(benchmark.run), f"{kernel.benchmark} has no run(copy_gbps)"
    # python -m benchmarks --steps-only passes it to every benchmark
    assert "steps_only" in inspect.signature(benchmark.run).parameters, f"{kernel.benchmark}.run takes no steps_only"


def test_every_kernel_module_is_registered():
    kernel_dir = ROOT / "course_lib" / "kernels"
    on_disk = {f"kernels.{path.stem}" for path in kernel_dir.glob("*_op.py")}
    on_disk |= {f"kernels.{path.parent.name}" for path in kernel_dir.glob("*_op/__init__.py")}
    assert on_disk == {kernel.module for kernel in KERNELS if kernel.module.startswith("kernels.")}


def test_every_benchmark_file_is_registered():
    on_disk = {path.stem.removeprefix("bench_") for path in (ROOT / "benchmarks").glob("bench_*.py")}
    assert on_disk == set(BY_NAME)


def test_targets_and_results_rows_name_registered_kernels():
    from benchmarks import targets

    assert {target.kernel for target in targets.TARGETS} <= targets.REGISTERED
    assert kernel_of_result("causal_softmax") is BY_NAME["softmax"]
    with pytest.raises(KeyError, match="no kernel in course_lib.registry gives results named 'conv2d'"):
        kernel_of_result("conv2d")


def test_the_gpu_run_and_benchmarks_runner_read_the_registry():
    gpu_run = (ROOT / "scripts" / "gpu_run.sh").read_text()
    assert "python3 -m course_lib.registry" in gpu_run
    assert "weighted_sum softmax" not in gpu_run  # no list of its own
    from benchmarks import __main__ as runner

    assert runner.NAMES == [kernel.name for kernel in KERNELS]


def test_the_registry_prints_its_names(capsys):
    import runpy

    runpy.run_module("course_lib.registry", run_name="__main__")
    assert capsys.readouterr().out.split() == [kernel.name for kernel in KERNELS]
