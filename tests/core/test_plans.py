"""Launch plans and the warps rule (course_lib/core/plans.py), and the tuning record each
kernel keeps beside its plans."""

import pytest

from course_lib.core.plans import LaunchPlan, TunedOn, warps_for
from course_lib.registry import KERNELS


@pytest.mark.parametrize(("amount", "per_warp", "options", "warps"), [
    (1, 256, {}, 1), (256, 256, {}, 1), (1024, 256, {}, 4), (1 << 20, 256, {}, 16),
    (1 << 20, 256, {"max_warps": 32}, 32),
    (1024, 2048, {"min_warps": 4}, 4),  # a small tile still gets min_warps
    (64, 8, {"fill": 32}, 2),  # 8 wanted, but 64 columns fill only 2 warps of 32
    (16, 8, {"min_warps": 4, "fill": 32}, 1),  # never fewer than 1
])
def test_warps_for(amount, per_warp, options, warps):
    assert warps_for(amount, per_warp, **options) == warps


def test_a_plan_defaults_to_no_pipelining_and_unpacks_in_order():
    plan = LaunchPlan(2, 128, 4)
    assert plan.num_stages == 1
    block_rows, block_cols, num_warps, num_stages = plan
    assert (block_rows, block_cols, num_warps, num_stages) == (2, 128, 4, 1)


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k.module.startswith("kernels.")], ids=lambda k: k.name)
def test_every_kernel_says_where_its_plans_were_tuned(kernel):
    module = kernel.load()
    tuned = getattr(module, "TUNED_ON", None) or module.parts.TUNED_ON  # LayerNorm keeps its plans in parts
    assert isinstance(tuned, TunedOn) and tuned.gpu and tuned.triton
    assert tuned.sweep == f"benchmarks/tune_{kernel.name}.py"
