"""LayerNorm (chapter 3): ``tiled`` holds the kernels of rows that fit one tile and the
public function, which hands rows wider than a tile to ``wide``; ``parts`` holds the
tile plans and the ``@triton.jit`` pieces both share."""

from .tiled import LayerNorm, layer_norm, layernorm

__all__ = ["layernorm", "layer_norm", "LayerNorm"]
