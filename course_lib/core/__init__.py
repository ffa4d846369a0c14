"""The core every other room builds on: ``runtime`` (GPU or interpreter, launches),
``validation`` (input checks with clear errors), ``rows`` (the row view, load widths and
the deterministic column sum), ``split_rows`` and ``partial_rows`` (pieces several kernels
share), ``plans`` (launch plans and warps), ``operator`` (one way to make a kernel an
operator), ``references`` (the pure-PyTorch specifications) and ``benchmarking`` (the
timing harness and the results files).

Nothing is imported here: ``runtime`` must be the first module to load triton, and
``course_lib/__init__.py`` imports it before anything else.
"""
