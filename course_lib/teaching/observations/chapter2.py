"""Chapter 2's observations: readings of what its cells measure on the reader's GPU.

The warp sweep (one row of the causal forward a program, at every warp count) and the
autotuning cell. Registers, spills and the programs an SM holds come from the compiled
kernel and the GPU's properties; the warps an SM holds are the reader's GPU's own (64
on an H100 or an H200, 48 on an L4), never assumed.
"""

from . import ratio, reading


@reading("ch2_occupancy", example={
    "an SM, warps per SM": 64, "plans that spill, count": 0,
    "float32 at 1 warp, registers": 192, "programs an SM at 1 warp, count": 10,
    "programs the registers allow at 1 warp, count": 10,
    "programs an SM at 32 warps, count": 2})
def occupancy(figures):
    """What limits the programs an SM holds, at one warp a program and at 32."""
    warps = max(figures["an SM, warps per SM"], 1)
    spills = round(figures["plans that spill, count"])
    regs = figures["float32 at 1 warp, registers"]
    one = figures["programs an SM at 1 warp, count"]
    by_registers = figures["programs the registers allow at 1 warp, count"]
    at_32 = figures["programs an SM at 32 warps, count"]
    if spills == 0:
        first = (f"No plan spills: at one warp a thread holds its 128 float32 values "
                 f"in {regs:.0f} registers.")
    else:
        first = (f"{spills} plan(s) spill registers to local memory, traffic that "
                 "slows them.")
    occupancy_1 = one / warps
    if one >= warps:
        second = f" One-warp programs fill all {warps:.0f} warp slots of an SM."
    elif by_registers <= one:
        second = (f" At one warp, registers limit an SM to {one:.0f} programs, an "
                  f"occupancy of {occupancy_1:.0%}"
                  + (" (under a quarter)." if occupancy_1 < 0.25 else "."))
    else:
        second = (f" At one warp an SM holds {one:.0f} programs (occupancy "
                  f"{occupancy_1:.0%}): its cap on resident programs or shared memory "
                  "sets the limit, not registers.")
    occupancy_32 = at_32 * 32 / warps
    fit = "program fits" if round(at_32) == 1 else "programs fit"
    third = (f" At 32 warps {at_32:.0f} {fit}, {occupancy_32:.0%} of the "
             f"{warps:.0f} warp slots")
    if occupancy_32 >= 0.999:
        third += ": full occupancy."
    elif warps % 32:
        third += f": programs of 32 warps cannot fill an SM of {warps:.0f}."
    else:
        third += "."
    return first + second + third


@reading("ch2_warp_times", example={
    "float32 at 1 warp, of C": 0.93, "float32 at 32 warps, of C": 0.72,
    "bfloat16 at 32 warps, of C": 0.47,
    "float32 at its slowest warps, of C": 0.72,
    "bfloat16 at its slowest warps, of C": 0.47,
    "float32 at its best warps, of C": 0.96,
    "bfloat16 at its best warps, of C": 0.95,
    "float32 at course_lib's warps, of C": 0.95,
    "bfloat16 at course_lib's warps, of C": 0.95})
def warp_times(figures):
    """Rows of 4096: does the time follow occupancy; is course_lib's choice the best?"""
    one = figures["float32 at 1 warp, of C"]
    f32 = figures["float32 at 32 warps, of C"]
    b32 = figures["bfloat16 at 32 warps, of C"]
    if one >= f32 + 0.1:
        first = (f"One warp a program reaches {one:.2f} of C in float32, more than "
                 f"32 warps ({f32:.2f}), which keep more warps resident: the time does "
                 "not follow occupancy.")
    elif one > f32 - 0.1:
        first = (f"One warp ({one:.2f} of C in float32) and 32 warps ({f32:.2f}) come "
                 "within 0.1 of C: here occupancy hardly moves the time.")
    else:
        first = (f"32 warps ({f32:.2f} of C in float32) beat one warp ({one:.2f}) by "
                 "more than 0.1 of C: here the higher occupancy pays.")
    slowest = [dtype for dtype, at_32 in (("float32", f32), ("bfloat16", b32))
               if at_32 <= figures[f"{dtype} at its slowest warps, of C"] + 0.005]
    if len(slowest) == 2:
        second = " 32 warps is the slowest warp count in both dtypes."
    elif slowest:
        second = f" 32 warps is the slowest warp count in {slowest[0]} only."
    else:
        second = " 32 warps is not the slowest warp count here."
    short = max(figures[f"{dtype} at its best warps, of C"]
                - figures[f"{dtype} at course_lib's warps, of C"]
                for dtype in ("float32", "bfloat16"))
    if short <= 0.03:
        third = (" course_lib's warp counts come within 0.03 of C of the sweep's best "
                 "in both dtypes.")
    else:
        third = (f" course_lib's warp counts, chosen on an H200, fall {short:.2f} of C "
                 "short of the best here: a sweep on this GPU would choose others.")
    return first + second + third


@reading("ch2_bytes_in_flight", example={
    "plans at 0.85 of C or more, count": 16, "plans below 0.85 of C, count": 4,
    "fewest KiB resident at 0.85 of C or more, KiB": 64,
    "most KiB resident below 0.85 of C, KiB": 64,
    "largest gap of bfloat16 8192 to float32 4096, of C": 0.06})
def bytes_in_flight(figures):
    """Do the plans below 0.85 of C hold the fewest bytes of rows on an SM?"""
    fast = round(figures["plans at 0.85 of C or more, count"])
    slow = round(figures["plans below 0.85 of C, count"])
    fewest_fast = figures["fewest KiB resident at 0.85 of C or more, KiB"]
    most_slow = figures["most KiB resident below 0.85 of C, KiB"]
    if slow == 0:
        first = "Every plan reaches 0.85 of C: bytes in flight never ran short here."
    elif fast == 0:
        first = "No plan reaches 0.85 of C here, whatever the bytes in flight."
    elif most_slow < fewest_fast:
        first = (f"Every plan below 0.85 of C held fewer KiB of rows on an SM (at "
                 f"most {most_slow:.0f}) than every faster one (at least "
                 f"{fewest_fast:.0f} KiB): the time follows the bytes in flight.")
    else:
        first = (f"The KiB column does not split the plans cleanly: one below 0.85 of "
                 f"C held {most_slow:.0f} KiB, one at 0.85 or more only "
                 f"{fewest_fast:.0f} KiB; bytes in flight are not the whole story "
                 "here.")
    gap = figures["largest gap of bfloat16 8192 to float32 4096, of C"]
    if gap <= 0.08:
        second = (f" bfloat16 rows of 8192 and float32 rows of 4096, the same bytes, "
                  f"come within {gap:.2f} of C of each other at every warp count.")
    else:
        second = (f" bfloat16 rows of 8192 and float32 rows of 4096, the same bytes, "
                  f"differ by up to {gap:.2f} of C: here the dtype matters beyond "
                  "the bytes.")
    return first + second


@reading("ch2_autotune", example={
    "first call (1024 columns), µs": 1200000.0,
    "tuning again (1024 columns), µs": 550000.0,
    "autotuned (1024 columns), µs": 135.0,
    "course_lib's plan (1024 columns), µs": 135.0,
    "configs within 3% of the fastest (1024 columns), count": 4,
    "first call (4096 columns), µs": 1400000.0,
    "tuning again (4096 columns), µs": 550000.0,
    "autotuned (4096 columns), µs": 135.0,
    "course_lib's plan (4096 columns), µs": 135.0,
    "configs within 3% of the fastest (4096 columns), count": 4})
def autotune(figures):
    """@triton.autotune against course_lib's table, on float32 rows of 1024 and 4096."""
    widths = (1024, 4096)

    def get(what, n, unit="µs"):
        return figures[f"{what} ({n} columns), {unit}"]

    ratios = {n: ratio(get("autotuned", n), get("course_lib's plan", n))
              for n in widths}
    shown = ", ".join(f"{ratios[n]:.2f}× on rows of {n}" for n in widths)
    if all(abs(r - 1) <= 0.05 for r in ratios.values()):
        first = (f"After tuning, the autotuned kernel and course_lib's plan run within "
                 f"5% of each other (autotuned over plan: {shown}).")
    else:
        faster = " and ".join(f"{n}" for n in widths if ratios[n] < 0.95)
        slower = " and ".join(f"{n}" for n in widths if ratios[n] > 1.05)
        first = (f"After tuning, the two differ by more than 5% (autotuned over plan: "
                 f"{shown})"
                 + (f"; autotuning beats the table, chosen on an H200, on rows of "
                    f"{faster}" if faster else "")
                 + (f"; course_lib's plan beats autotuning's configs on rows of "
                    f"{slower}" if slower else "") + ".")
    compiled = [n for n in widths if get("tuning again", n) < get("first call", n)]
    first_s = get("first call", 1024) / 1e6
    again_s = get("tuning again", 1024) / 1e6
    if len(compiled) == 2:
        second = (f" Compiling is part of the first call: on rows of 1024 that took "
                  f"{first_s:.2f} s, tuning again with every config compiled "
                  f"{again_s:.2f} s.")
    else:
        second = (" Tuning again, every config compiled, took no less than the first "
                  "call at some width: compiling was a small part of it here.")
    calls = min(ratio(get("first call", n), get("autotuned", n)) for n in widths)
    third = (f" A first call costs as much as {calls:,.0f} later calls or more"
             + (", over a thousand." if calls > 1000 else "."))
    ties = [round(get("configs within 3% of the fastest", n, "count")) for n in widths]
    if min(ties) >= 2:
        verdict = "several tie, so which one is picked hardly matters."
    else:
        verdict = "at some width one config stands out."
    fourth = (f" {ties[0]} and {ties[1]} of the 5 configs come within 3% of the "
              f"fastest: {verdict}")
    return first + second + third + fourth
