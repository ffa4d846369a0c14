"""Chapter 4's observations: readings of what its cells measure on the reader's GPU."""

from . import ratio, reading

CLOSE = 1.15  # ratios within 15% of 1 read as "about the same"
HOST_BOUND = 1.5  # a do_bench time this many times the GPU's own: the host sets it


def _host_bound(timed, gpu):
    """Whether the host sets a do_bench time: much longer than the GPU alone takes."""
    return ratio(timed, gpu) > HOST_BOUND


@reading("ch4_seed_forward", example={
    "seed, µs": 96.0, "seed, GPU µs": 94.0,
    "course_lib, µs": 48.0, "course_lib, GPU µs": 41.0})
def seed_forward(figures):
    """The seed's forward against the finished one, 1024 rows of 4096, 20 iterations:
    which is faster on the GPU alone, and does the host change the timed ratio?"""
    seed, seed_gpu = figures["seed, µs"], figures["seed, GPU µs"]
    ours, ours_gpu = figures["course_lib, µs"], figures["course_lib, GPU µs"]
    on_gpu, timed = ratio(seed_gpu, ours_gpu), ratio(seed, ours)
    if on_gpu >= CLOSE:
        first = (f"On the GPU alone the seed's forward takes {on_gpu:.2f}× the "
                 "finished one's time.")
    elif on_gpu > 1 / CLOSE:
        first = (f"On the GPU alone the two forwards take about the same time "
                 f"({on_gpu:.2f}×, within 15%).")
    else:
        first = (f"On the GPU alone the finished forward takes "
                 f"{ratio(1, on_gpu):.2f}× the seed's time here.")
    pairs = (("the seed", seed, seed_gpu), ("course_lib", ours, ours_gpu))
    hosts = [name for name, t, g in pairs if _host_bound(t, g)]
    if hosts:
        second = (f" Timed as a loop calls them, {timed:.2f}×: in {' and '.join(hosts)}"
                  " the host's work outlasts the kernels, so that ratio is partly the"
                  " host's.")
    else:
        second = (f" Timed as a loop calls them, {timed:.2f}×: the GPU sets both "
                  "times, the host keeps up.")
    return first + second


@reading("ch4_single_launch", example={
    "one cooperative launch, µs": 48.0, "one cooperative launch, GPU µs": 38.0,
    "one launch a step, µs": 190.0, "one launch a step, GPU µs": 95.0})
def single_launch(figures):
    """4 rows of 131072, 20 iterations (22 steps), forward: one cooperative launch
    against one launch a step. The GPU's difference (each launch starts its programs
    and reloads the tiles) or the host's (22 launches)?"""
    one = figures["one cooperative launch, µs"]
    one_gpu = figures["one cooperative launch, GPU µs"]
    per = figures["one launch a step, µs"]
    per_gpu = figures["one launch a step, GPU µs"]
    timed, on_gpu = ratio(per, one), ratio(per_gpu, one_gpu)
    if timed >= CLOSE:
        first = (f"One launch a step takes {timed:.2f}× the time of one cooperative "
                 "launch.")
    elif timed > 1 / CLOSE:
        first = f"The two paths take about the same time ({timed:.2f}×, within 15%)."
    else:
        first = f"Here one launch a step is faster, by {ratio(1, timed):.2f}×."
    if on_gpu >= CLOSE:
        second = (f" On the GPU alone, {on_gpu:.2f}×: each of its 22 launches starts "
                  "its programs anew and reloads the tiles.")
    elif on_gpu > 1 / CLOSE:
        second = (f" On the GPU alone, {on_gpu:.2f}×, within 15%: the kernels cost "
                  "about the same either way.")
    else:
        second = (f" On the GPU alone, {on_gpu:.2f}×: the kernels of one launch a step "
                  "take less time than the cooperative one.")
    if _host_bound(per, per_gpu):
        second += (f" Timed, the per-step path is host-bound ({per:.0f} µs against "
                   f"{per_gpu:.0f} µs on the GPU alone): the host work of 22 launches.")
    return first + second
