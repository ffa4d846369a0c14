"""Chapter 5's observations: readings of what its cells measure on the reader's GPU.

Most of chapter 5 weighs the host's time against the GPU's, and that split is the
host's as much as the GPU's: the same step is host-bound on a slow CPU and GPU-bound
on a fast one. Every reading here chooses its words from the reader's own split.
"""

from . import ratio, reading

CLOSE = 1.15  # two times within this factor of each other read as "about the same"


def _ratio(a, b):
    """a / b, or 0.0 where b is not positive: these readings say "nothing to compare"."""
    return ratio(a, b, otherwise=0.0)


def _split(host, gpu):
    """Which side sets a step's pace, from its host time and its GPU time."""
    ratio = _ratio(host, gpu)
    if ratio > CLOSE:
        return (f"host-bound: the host's time is {ratio:.1f}× the GPU's, so the GPU "
                "waits between kernels and faster kernels would not make it faster")
    if ratio >= 1 / CLOSE:
        return (f"at the edge: the host's time is {ratio:.2f}× the GPU's, so a "
                "faster host or faster kernels would each gain little alone")
    return (f"GPU-bound: the host's time is only {ratio:.2f}× the GPU's, so this "
            "host queues kernels faster than they run and the kernels set the pace")


@reading("ch5_profile", example={"course_lib step, µs": 300.0,
                                 "its kernels, GPU µs": 60.0,
                                 "its backward, host µs": 150.0,
                                 "torch step, µs": 180.0,
                                 "torch backward, host µs": 45.0})
def profile(figures):
    """One profiled LayerNorm step: how full is the GPU's row, and how long does the
    autograd.Function's backward hold the host against PyTorch's C++ backward?"""
    share = _ratio(figures["its kernels, GPU µs"], figures["course_lib step, µs"])
    busy = f"The GPU was busy for {share:.0%} of course_lib's step: "
    if share < 0.5:
        first = busy + ("its row is mostly empty, it waits for the host, and the "
                        "step is host-bound.")
    elif share < 0.85:
        first = busy + "it waits for the host for part of the step."
    else:
        first = busy + "this host keeps ahead of it, and the kernels set the pace."
    ratio = _ratio(figures["its backward, host µs"], figures["torch backward, host µs"])
    held = " The autograd.Function's backward holds the host "
    if ratio > 2:
        second = held + (f"{ratio:.1f}× as long as PyTorch's C++ "
                         "NativeLayerNormBackward0: Python costs the host.")
    elif ratio > CLOSE:
        second = held + f"{ratio:.1f}× as long as PyTorch's NativeLayerNormBackward0."
    elif ratio > 0:
        second = held + (f"about as long as PyTorch's NativeLayerNormBackward0 "
                         f"({ratio:.2f}×).")
    else:
        second = " The profile showed no backward on a host thread to compare."
    return first + second


@reading("ch5_host_split", example={"kernel[grid] launch, host µs": 12.0,
                                    "torch.empty, host µs": 4.0,
                                    "LayerNorm step, host µs": 300.0,
                                    "LayerNorm step, GPU µs": 60.0})
def host_split(figures):
    """The LayerNorm step's host time against its GPU time: host- or GPU-bound here?"""
    host = figures["LayerNorm step, host µs"]
    verdict = _split(host, figures["LayerNorm step, GPU µs"])
    launches = _ratio(host, figures["kernel[grid] launch, host µs"])
    return (f"Here the LayerNorm step is {verdict}. Its host time is that of "
            f"{launches:.0f} launches of the tiny kernel.")


@reading("ch5_graph_replay", example={"eager step, host µs": 300.0,
                                      "replay, host µs": 8.0,
                                      "eager step, µs": 310.0,
                                      "replay, µs": 62.0,
                                      "the step's kernels, GPU µs": 60.0})
def graph_replay(figures):
    """The LayerNorm step replayed from a CUDA graph against the eager step: what the
    replay saves the host, and whether that makes the step faster on this host."""
    gpu = figures["the step's kernels, GPU µs"]
    host_share = _ratio(figures["replay, host µs"], figures["eager step, host µs"])
    eager, replay = figures["eager step, µs"], figures["replay, µs"]
    speedup, waited = _ratio(eager, replay), _ratio(eager, gpu)
    first = (f"A replay costs the host {host_share:.0%} of the eager step's host "
             "time. ")
    if waited > CLOSE and speedup > CLOSE:
        second = (f"The eager step took {waited:.1f}× the GPU's time, waiting for the "
                  f"host; the replay does not wait, and is {speedup:.1f}× as fast.")
    elif waited > CLOSE:
        second = (f"The eager step took {waited:.1f}× the GPU's time, yet the replay "
                  f"is only {speedup:.2f}× as fast: more than the host's Python holds "
                  "it.")
    elif speedup > CLOSE:
        second = (f"The eager step took about the GPU's time ({waited:.2f}×), yet the "
                  f"replay is {speedup:.2f}× as fast: its kernels follow each other "
                  "without eager's gaps.")
    else:
        second = (f"This host keeps up with the GPU: the eager step already took "
                  f"{waited:.2f}× the GPU's time, so the replay has little to remove "
                  f"({speedup:.2f}× as fast). CUDA graphs pay where the host is "
                  "slower.")
    at_gpu = _ratio(replay, gpu)
    third = (f" The replayed step takes {at_gpu:.2f}× the GPU's time of the step"
             + (", about the GPU's time." if at_gpu <= 1.5 else "."))
    return first + second + third


@reading("ch5_reduce_overhead", example={"1 LayerNorm eager, µs": 310.0,
                                         "1 LayerNorm reduce-overhead, µs": 330.0,
                                         "16 LayerNorms eager, µs": 4900.0,
                                         "16 LayerNorms reduce-overhead, µs": 1000.0,
                                         "replay by hand, µs": 62.0})
def reduce_overhead(figures):
    """torch.compile(mode="reduce-overhead") for one LayerNorm and for sixteen: what its
    per-call host work costs against the hand replay, and whether depth pays it back."""
    one = _ratio(figures["1 LayerNorm eager, µs"],
                 figures["1 LayerNorm reduce-overhead, µs"])
    sixteen = _ratio(figures["16 LayerNorms eager, µs"],
                     figures["16 LayerNorms reduce-overhead, µs"])
    over_hand = _ratio(figures["1 LayerNorm reduce-overhead, µs"],
                       figures["replay by hand, µs"])
    if over_hand > 1.5:
        first = (f"For one LayerNorm the compiled step takes {over_hand:.1f}× the hand "
                 "replay: its own host work at every call (guards, inputs, autograd) "
                 "shows. ")
    else:
        first = (f"For one LayerNorm the compiled step takes {over_hand:.2f}× the hand "
                 "replay: this host does its per-call work in little time. ")
    gains = (f"Eager over compiled is {one:.2f}× for one layer and {sixteen:.2f}× for "
             "sixteen: ")
    if sixteen > CLOSE * max(one, 1.0):
        second = gains + "the per-call cost is paid once, however many layers it holds."
    elif sixteen > CLOSE:
        second = gains + ("both gain alike: on this host the per-call work is small "
                          "against the host time the graphs remove.")
    else:
        second = gains + ("here eager's layers already keep the GPU busy, and the "
                          "graphs have little host time to remove.")
    return first + second


@reading("ch5_direct_launch", example={"kernel[grid], host µs": 12.0,
                                       "runtime.launch, host µs": 9.0,
                                       "step through kernel[grid], host µs": 320.0,
                                       "step with runtime.launch, host µs": 280.0})
def direct_launch(figures):
    """runtime.launch against kernel[grid], for one tiny launch and for the LayerNorm
    step's host time."""
    launch = _ratio(figures["runtime.launch, host µs"],
                    figures["kernel[grid], host µs"])
    if launch < 1 / CLOSE:
        first = f"runtime.launch costs the host {launch:.2f}× what kernel[grid] costs. "
    elif launch <= CLOSE:
        first = (f"runtime.launch and kernel[grid] cost the host about the same here "
                 f"({launch:.2f}×): a two-argument kernel leaves little to work out. ")
    else:
        first = (f"runtime.launch costs the host {launch:.2f}× what kernel[grid] costs "
                 "here: its key does not pay for a kernel this simple. ")
    share = _ratio(figures["step with runtime.launch, host µs"],
                   figures["step through kernel[grid], host µs"])
    step = "The LayerNorm step's host time "
    if share < 0.95:
        second = step + f"drops to {share:.2f} of kernel[grid]'s"
    elif share <= 1.05:
        second = step + f"barely moves ({share:.2f} of kernel[grid]'s)"
    else:
        second = step + f"rises to {share:.2f}× kernel[grid]'s"
    rest = (": most of it is the autograd.Function and the autograd engine."
            if share > 0.5 else ": the launches were most of it on this host.")
    return first + second + rest
