"""Chapter 1's observations: readings of what its cells measure on the reader's GPU."""

from . import reading  # noqa: F401  (each reading registers itself)


@reading("ch1_odd_widths", example={"1024 columns, µs": 50.3, "1008 columns, µs": 49.2,
                                    "1000 columns, µs": 49.0, "1023 columns, µs": 51.9})
def odd_widths(figures):
    """The same bfloat16 rows at four widths: do the launcher's VEC hint and the
    narrow-load tiles keep the odd widths near 1024 columns on this GPU?"""
    base = figures["1024 columns, µs"]
    vec = figures["1000 columns, µs"] / figures["1008 columns, µs"]
    odd = figures["1023 columns, µs"] / base
    first = f"1000 columns (VEC = 8) take {vec:.2f}× the time of 1008, "
    if vec > 1.10:
        first += ("more than 10% longer: on this GPU the hint did not make up for what "
                  "1008's strides prove.")
    elif vec >= 1 / 1.10:
        first += "as fast within 10%: the hint gave the compiler its 16-byte loads."
    else:
        first += ("faster than 1008 here: these calls are short, and from one to the next "
                  "their times move by more than a load's width costs.")
    second = f" 1023 columns, a load per value, take {odd:.2f}× the time of 1024: "
    if odd > 1.15:
        second += ("over 15% longer, so here loads of one value each cost more than the extra "
                   "loads in flight win back; pad such rows to a multiple of 8.")
    elif odd >= 1 / 1.15:
        second += "within 15%, the narrow-load tiles keep enough loads in flight here."
    else:
        second += ("faster than 1024 here: these calls are short, and from one to the next "
                   "their times move by more than the width of a load costs.")
    return first + second


@reading("ch1_forward_vs_matmul", example={
    "course_lib, µs": 67.7, "course_lib, GPU µs": 66.9,
    "x @ w, µs": 75.2, "x @ w, GPU µs": 74.5})
def forward_vs_matmul(figures):
    """course_lib's forward against x @ w (cuBLAS's matrix-vector product) on one
    bfloat16 shape, as timed and on the GPU alone: a slow host told from a slow
    kernel."""
    ours, theirs = figures["course_lib, µs"], figures["x @ w, µs"]
    ours_gpu, theirs_gpu = figures["course_lib, GPU µs"], figures["x @ w, GPU µs"]
    ratio, gpu_ratio = ours / theirs, ours_gpu / theirs_gpu
    sentence = f"course_lib's forward takes {ratio:.2f}× the time of x @ w"
    if ratio <= 1.05:
        return sentence + ": as fast or faster (within 5%)."
    if ours > 1.15 * ours_gpu:
        return (sentence + f", but its GPU alone takes {ours_gpu:.1f} of its "
                f"{ours:.1f} µs: the host's side of the call sets its time on this "
                "machine, not the kernel.")
    if gpu_ratio > 1.05:
        return (sentence + f", {gpu_ratio:.2f}× on the GPU alone too: cuBLAS picks "
                "a kernel for each GPU, course_lib's tiles come from one sweep "
                "(benchmarks/tune_weighted_sum.py, which can be rerun here).")
    return (sentence + f", yet {gpu_ratio:.2f}× on the GPU alone: the kernels are "
            "level and the difference is in the calls.")


@reading("ch1_coalescing", example={
    "course_lib contiguous, of C": 0.95, "v1 contiguous, of C": 0.88,
    "course_lib transposed, of C": 0.31, "v1 transposed, of C": 0.79,
    "course_lib strided, of C": 0.47, "v1 strided, of C": 0.40})
def coalescing(figures):
    """Two kernels on three layouts of one float32 x, in fractions of C of the bytes the
    sum uses: the fastest layout, what every other column costs, the transposed x."""
    kernels, layouts = ("course_lib", "v1"), ("contiguous", "transposed", "strided")
    frac = {(kernel, layout): figures[f"{kernel} {layout}, of C"]
            for kernel in kernels for layout in layouts}
    beaten = [kernel for kernel in kernels
              if frac[kernel, "contiguous"] * 1.05
              < max(frac[kernel, "transposed"], frac[kernel, "strided"])]
    first = ("The contiguous x is the fastest layout for both kernels (within 5%)."
             if not beaten else
             f"For {' and '.join(beaten)} another layout beats the contiguous x by "
             "more than 5%.")
    strided = max(frac["course_lib", "strided"], frac["v1", "strided"])
    second = (" Every other column costs both about half of C (at most 0.55 of it): "
              "half of every sector holds columns the sum skips."
              if strided <= 0.55 else
              f" Every other column still reaches up to {strided:.2f} of C: reading "
              "alone runs faster than the copy that sets C on this GPU.")
    v1_transposed = frac["v1", "contiguous"] / frac["v1", "transposed"]
    third = (f" v1 takes {v1_transposed:.2f}× its contiguous time on the transposed x: "
             + ("within 25%, its 16-row tiles let the lanes walk down the columns."
                if v1_transposed <= 1.25 else
                "over 25% more, its 16-row tiles coalesce less well here."))
    lib_over_v1 = frac["v1", "transposed"] / frac["course_lib", "transposed"]
    fourth = (f" course_lib takes {lib_over_v1:.2f}× v1's time on it: "
              + ("its tiles for narrow loads, two rows tall, read 8 bytes down a "
                 "column."
                 if lib_over_v1 > 1.5 else
                 "slower, by less than 1.5×." if lib_over_v1 > 1 else
                 "no slower than v1 on this GPU."))
    return first + second + third + fourth


@reading("ch1_roofline", example={
    "bfloat16 ridge over the most intense kernel, ×": 16.2,
    "float32 ridge over the most intense kernel, ×": 1.16,
    "weighted-sum forward, of C": 0.96, "weighted-sum backward, of C": 0.91})
def roofline(figures):
    """Where the ridge points measured on this GPU fall against the course's most
    arithmetic-heavy kernel, and how close the weighted sum comes to its copy roof."""
    ridge = figures["bfloat16 ridge over the most intense kernel, ×"]
    fp32 = figures["float32 ridge over the most intense kernel, ×"]
    forward = figures["weighted-sum forward, of C"]
    backward = figures["weighted-sum backward, of C"]
    if ridge >= 10:
        first = (f"The bfloat16 ridge lies {ridge:.0f}× right of the most intense "
                 "kernel: every course kernel sits far left of it, and bytes set its "
                 "time.")
    elif ridge >= 1:
        first = (f"The bfloat16 ridge lies only {ridge:.1f}× right of the most intense "
                 "kernel: bytes still set the time, with less to spare than ten times.")
    else:
        first = (f"The most intense kernel passes the bfloat16 ridge ({ridge:.2f}×): "
                 "its arithmetic could bound it here.")
    second = (f" The float32 ridge is {fp32:.2f}× its intensity, "
              + ("so even that kernel stays left of it." if fp32 >= 1 else
                 "so in float32 without tensor cores its arithmetic could bound it."))
    third = (f" The weighted sum reaches {forward:.2f} of its copy roof forward and "
             f"{backward:.2f} backward"
             + ("." if forward >= 0.8 else
                ": below 0.8 forward, so benchmarks/tune_weighted_sum.py's sweep may "
                "find better tiles for this GPU."))
    return first + second + third
