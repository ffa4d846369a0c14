"""The core every other room builds on: ``runtime`` (GPU, or the interpreter by
``use_interpreter``; launches),
``validation`` (input checks with clear errors), ``rows`` (the row view, load widths and
the deterministic column sum), ``split_rows`` and ``partial_rows`` (pieces several kernels
share), ``plans`` (launch plans and warps), ``operator`` (one way to make a kernel an
operator), ``references`` (the pure-PyTorch specifications) and ``benchmarking`` (the
timing harness and the results files).

Nothing is imported here: each module is imported where it is used.
"""
