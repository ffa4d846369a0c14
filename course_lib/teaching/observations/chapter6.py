"""Chapter 6's observations: readings of what its cells measure on the reader's GPU."""

from . import reading  # noqa: F401  (each reading registers itself)
