"""Chapter 6's observations: readings of what its cells measure on the reader's GPU."""

from . import ratio, reading


@reading("ch6_tile_shapes", example={
    "cuBLAS, TFLOP/s": 620.0, "64×64×32 at 2 stages, TFLOP/s": 250.0, "128×128×64 at 2 stages, TFLOP/s": 420.0,
    "128×128×64 at 3 stages, TFLOP/s": 480.0, "128×256×64 at 3 stages, TFLOP/s": 540.0})
def tile_shapes(figures):
    """course_lib's kernel at 4096³ with tiles and stages chosen by hand, beside cuBLAS."""
    cublas = figures["cuBLAS, TFLOP/s"]
    mine = {key: value for key, value in figures.items() if key != "cuBLAS, TFLOP/s"}
    best = max(mine, key=mine.get)
    small, large = figures["64×64×32 at 2 stages, TFLOP/s"], figures["128×128×64 at 2 stages, TFLOP/s"]
    two, three = large, figures["128×128×64 at 3 stages, TFLOP/s"]
    tiles = (f"128 × 128 tiles do {ratio(large, small):.1f}× the work a second of 64 × 64 ones (more reuse of each "
             "loaded element)" if large > small else
             f"64 × 64 tiles are as fast as 128 × 128 ones or faster here ({ratio(small, large):.1f}×): this GPU's "
             "SMs are kept busier by more, smaller programs than by reuse")
    stages = (f"a third stage adds {ratio(three, two) - 1:.0%}" if three > two * 1.02 else
              "a third stage changes little here: two already hide the loads' latency")
    return (f"{tiles}; {stages}. The best of these, {best.rsplit(',', 1)[0]}, reaches {ratio(mine[best], cublas):.2f} "
            "of cuBLAS's throughput.")


@reading("ch6_grouped_order", example={"row by row, TFLOP/s": 500.0, "GROUP_M 8, TFLOP/s": 560.0,
                                       "best grouped, TFLOP/s": 570.0})
def grouped_order(figures):
    """course_lib's kernel at 8192³ with GROUP_M 1 (row by row) and grouped."""
    gain = ratio(figures["best grouped, TFLOP/s"], figures["row by row, TFLOP/s"], 1.0)
    if gain > 1.03:
        return (f"grouped order does {gain:.2f}× the work a second of row-by-row order: the strips of B stay in "
                "L2 between the programs of a wave instead of being read again from memory.")
    if gain >= 0.97:
        return (f"grouped and row-by-row order are within {abs(gain - 1):.0%} here: this GPU's L2 holds enough "
                "of B's strips for a wave either way (on a GPU with a smaller L2 the order matters more).")
    return (f"row-by-row order is {1 / gain:.2f}× as fast as the best grouped one here: the tiles this "
            "GPU runs at once already share their strips, and grouping only moves them.")


@reading("ch6_autotune_cost", example={"first call, µs": 9.0e6, "later call, µs": 150.0})
def autotune_cost(figures):
    """The first call of course_lib.matmul at a new shape (compiling and timing every
    configuration) against a later call."""
    calls = ratio(figures["first call, µs"], figures["later call, µs"])
    return (f"the first call cost as much as {calls:,.0f} later ones: worth it for a shape a model multiplies "
            "every step, not for shapes that change from one call to the next.")


@reading("ch6_profile", example={"course_lib's kernel, GPU µs": 190.0, "torch's kernels together, GPU µs": 230.0})
def profile(figures):
    """GPU time of course_lib's product with its fused bias and GELU, and of PyTorch's three
    kernels (a cuBLAS product, the add, GELU), from torch.profiler at 4096³."""
    ours, theirs = figures["course_lib's kernel, GPU µs"], figures["torch's kernels together, GPU µs"]
    lead = ratio(theirs, ours, 1.0)
    if lead >= 1:
        return (f"PyTorch's three kernels take {lead:.2f}× the GPU time of the fused one: the product's bytes "
                "cross memory once instead of five times.")
    return (f"the fused kernel takes {1 / lead:.2f}× the GPU time of PyTorch's three here: its product is slower "
            "than cuBLAS's by more than the epilogue saves. Nsight Compute would say whether its loads or its "
            "tensor cores wait.")
