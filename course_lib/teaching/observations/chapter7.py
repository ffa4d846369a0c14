"""Chapter 7's observations: readings of what its cells measure on the reader's GPU."""

from . import reading  # noqa: F401  (each reading registers itself)


@reading("ch7_tf32", example={"tf32 error over ieee error, ×": 4000.0})
def tf32(figures):
    """One (16, 64) by (64, 32) tile product with input_precision "tf32" (the default)
    and "ieee", each against float64: does this GPU round float32 inputs to TF32?"""
    ratio = figures["tf32 error over ieee error, ×"]
    if ratio >= 100:
        return (f"the default product's largest error is {ratio:.0f}× the ieee one's: "
                "this GPU rounded the float32 inputs to TF32, which keeps about three "
                "significant digits of float32's seven. Ask for 'ieee' where they "
                "matter.")
    if ratio > 3:
        return (f"the default product's largest error is {ratio:.1f}× the ieee one's: "
                "this GPU lost some digits with the default, fewer than TF32 usually "
                "does.")
    return (f"the default product's largest error is {ratio:.1f}× the ieee one's, the "
            "same digits: this GPU multiplied in full float32 either way (it has no "
            "TF32 tensor cores, or TF32 is switched off), so the default costs nothing "
            "here; on an A100 or later it would.")
