"""Chapter 3's observations: readings of what its cells measure on the reader's GPU."""

from . import ratio, reading

@reading("ch3_column_sums", example={"atomics, µs": 50.0, "lock, µs": 1100.0,
                                     "two stages, µs": 52.0,
                                     "atomics: distinct results in 20 runs, count": 20,
                                     "lock: distinct results in 20 runs, count": 20})
def column_sums(figures):
    """Three ways to add the partial rows of a column sum: is the lock slow, are two
    stages as fast as atomics, and did the unordered methods change their bits here?"""
    atomics, lock = figures["atomics, µs"], figures["lock, µs"]
    stages = figures["two stages, µs"]
    lock_x = ratio(lock, max(atomics, stages))
    if lock_x > 2:
        first = (f"The lock takes {lock_x:.1f}× the time of the slower of the other "
                 "two: programs queue for each column block's lock.")
    else:
        first = (f"The lock takes {lock_x:.1f}× the time of the slower of the other "
                 "two, not twice: here its programs seldom waited for one another.")
    stages_x = ratio(stages, atomics)
    if abs(stages_x - 1) <= 0.15:
        second = (f" Two stages take {stages_x:.2f}× the time of atomics, as fast "
                  "within 15%: the second launch reads only a few partial rows.")
    elif stages_x > 1:
        second = (f" Two stages take {stages_x:.2f}× the time of atomics: here the "
                  "second launch costs more than 15%.")
    else:
        second = (f" Two stages take {stages_x:.2f}× the time of atomics, faster: "
                  "here the atomics contend for the same addresses.")
    varied = [name for name in ("atomics", "lock")
              if figures[f"{name}: distinct results in 20 runs, count"] > 1]
    if len(varied) == 2:
        third = " Atomics and the lock both changed their bits from run to run."
    elif varied:
        third = (f" Only {varied[0]} changed its bits from run to run here; the "
                 "other's order happened to repeat, which nothing promises.")
    else:
        third = (" Atomics and the lock repeated their bits in these 20 runs: their "
                 "order is the scheduler's, so this is luck; only two stages fix it.")
    return first + second + third


@reading("ch3_profile", example={"layernorm_backward_kernel, GPU µs": 60.0,
                                 "layernorm_forward_kernel, GPU µs": 38.5,
                                 "column_sum_kernel, GPU µs": 2.5,
                                 "eager F.layer_norm's kernels, GPU µs": 186.0})
def profile(figures):
    """One bfloat16 forward and backward at 8192 x 4096: which of course_lib's kernels
    takes the step's GPU time, and what the fixed-order second stage costs."""
    backward = figures["layernorm_backward_kernel, GPU µs"]
    forward = figures["layernorm_forward_kernel, GPU µs"]
    second = figures["column_sum_kernel, GPU µs"]
    total = backward + forward + second
    bwd_share, fwd_share = ratio(backward, total), ratio(forward, total)
    sum_share = ratio(second, total)
    if backward >= forward:
        first = ("The persistent backward takes the largest share of course_lib's "
                 f"step, {bwd_share:.0%}")
    else:
        first = (f"Here the forward kernel takes more of the step ({fwd_share:.0%}) "
                 f"than the persistent backward ({bwd_share:.0%})")
    if sum_share < 0.1:
        first += (f"; column_sum_kernel, the second stage, {sum_share:.0%}: "
                  "reproducible dγ costs little.")
    else:
        first += (f"; column_sum_kernel, the second stage, {sum_share:.0%}: "
                  "more than a tenth on this GPU.")
    eager_x = ratio(figures["eager F.layer_norm's kernels, GPU µs"], total)
    return (first + f" Eager's kernels take {eager_x:.2f}× course_lib's GPU time"
            + ("." if eager_x >= 1 else ", less here."))


@reading("ch3_wide_loads", example={"layernorm_kernel_v1, of C": 0.80,
                                    "course_lib's forward, of C": 0.86})
def wide_loads(figures):
    """layernorm_kernel_v1 (a load a float) against the package's forward (16 bytes a
    load) on rows of 1000 float32 values, on the GPU alone."""
    v1 = figures["layernorm_kernel_v1, of C"]
    gain = ratio(figures["course_lib's forward, of C"], v1)
    if gain > 1.05:
        return (f"The package's forward reaches {gain:.2f}× v1's fraction of C: with "
                "a load for every four floats it keeps more bytes in flight a thread.")
    if gain >= 0.95:
        return (f"The two are within 5% ({gain:.2f}×): scalar loads still coalesce "
                "across a warp, and this GPU keeps enough of them in flight.")
    return (f"v1 is faster here (the package reaches {gain:.2f}× its fraction of C): "
            "the package's extra work, 64-bit offsets and any strides, costs more "
            "than its wide loads gain on this GPU.")


@reading("ch3_split_rows", example={"float32 split rows, of C": 0.85,
                                    "float32 two launches, of C": 0.57,
                                    "bfloat16 split rows, of C": 0.60,
                                    "bfloat16 two launches, of C": 0.50})
def split_rows(figures):
    """The split-row backward (each row read once, programs waiting for each other)
    against its two-launch fallback (each row read twice) at 2048 x 32768."""
    faster, even, slower = [], [], []
    for dtype in ("float32", "bfloat16"):
        gain = ratio(figures[f"{dtype} split rows, of C"],
                      figures[f"{dtype} two launches, of C"])
        text = f"{gain:.2f}× in {dtype}"
        (faster if gain > 1.05 else even if gain >= 0.95 else slower).append(text)
    parts = []
    if faster:
        parts.append("The split-row backward beats its two-launch fallback, "
                     + " and ".join(faster) + ": reading each row once pays.")
    if even:
        parts.append("Within 5% of the fallback, " + " and ".join(even)
                     + ": a refused cooperative launch runs the fallback both times.")
    if slower:
        parts.append("Slower than the fallback, " + " and ".join(slower)
                     + ": here waiting for each row's slowest block costs more than "
                     "a second read of x and dy.")
    return " ".join(parts)


@reading("ch3_backward_host", example={"float32 host, host µs": 220.0,
                                       "float32 do_bench, µs": 251.0,
                                       "float32 CUDA graph, GPU µs": 113.6,
                                       "bfloat16 host, host µs": 300.0,
                                       "bfloat16 do_bench, µs": 348.0,
                                       "bfloat16 CUDA graph, GPU µs": 63.3})
def backward_host(figures):
    """course_lib's backward through autograd.grad at 8192 x 4096: does the host's time
    a call or the kernels' time set what do_bench measures on this machine?"""
    sentences = []
    for dtype in ("float32", "bfloat16"):
        host = figures[f"{dtype} host, host µs"]
        bench = figures[f"{dtype} do_bench, µs"]
        graph = figures[f"{dtype} CUDA graph, GPU µs"]
        split = ratio(host, graph)
        if split > 1.1:
            sentences.append(
                f"In {dtype} the host's {host:.0f} µs a call exceed the kernels' "
                f"{graph:.0f} µs ({split:.1f}×): the GPU waits, and do_bench's "
                f"{bench:.0f} µs is mostly host time.")
        elif split < 0.9:
            sentences.append(
                f"In {dtype} the kernels' {graph:.0f} µs exceed the host's "
                f"{host:.0f} µs a call: the GPU sets the pace, and do_bench's "
                f"{bench:.0f} µs is the kernels' time.")
        else:
            sentences.append(
                f"In {dtype} the host's {host:.0f} µs a call and the kernels' "
                f"{graph:.0f} µs are within 10%: either can set the pace of "
                f"do_bench's {bench:.0f} µs.")
    return " ".join(sentences)
