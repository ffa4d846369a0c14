"""Chapter 1's observations: readings of what its cells measure on the reader's GPU."""

from . import reading  # noqa: F401  (each reading registers itself)


@reading("ch1_odd_widths", example={"1024 columns, µs": 50.3, "1008 columns, µs": 49.2,
                                    "1000 columns, µs": 49.0, "1023 columns, µs": 51.9})
def odd_widths(figures):
    """The same bfloat16 rows at four widths: do the launcher's VEC hint and the narrow-load
    tiles keep the odd widths near 1024 columns on this GPU?"""
    base = figures["1024 columns, µs"]
    vec = figures["1000 columns, µs"] / figures["1008 columns, µs"]
    odd = figures["1023 columns, µs"] / base
    first = (f"1000 columns (VEC = 8) take {vec:.2f}× the time of 1008, "
             + ("as fast within 10%: the hint gave the compiler its 16-byte loads." if vec <= 1.10 else
                "more than 10% longer: on this GPU the hint did not make up for what 1008's strides prove."))
    second = (f" 1023 columns, a load per value, take {odd:.2f}× the time of 1024: "
              + ("within 15%, the narrow-load tiles keep enough loads in flight here." if odd <= 1.15 else
                 "over 15% longer, so here loads of one value each cost more than the extra loads in "
                 "flight win back; pad such rows to a multiple of 8."))
    return first + second
