"""LayerNorm (chapter 3): ``whole_rows`` holds the kernels of rows held whole in one tile
and the public functions, which hand rows wider than a tile to ``wide_rows``; ``parts``
holds the tile plans and the ``@triton.jit`` pieces both share."""

from .whole_rows import LayerNorm, layer_norm, layernorm

__all__ = ["layernorm", "layer_norm", "LayerNorm"]
