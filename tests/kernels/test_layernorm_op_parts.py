import pytest

from course_lib.kernels.layernorm_op.parts import (BACKWARD_MAX_BLOCK, FORWARD_MAX_BLOCK, SHARED_MEMORY_RESERVE, backward_config,
                                                   forward_tiles, pipeline_shared_bytes)


@pytest.mark.parametrize("n_cols", [1, 2, 3, 17, 100, 1024, 4096, 8192, 16384, 32768, 2**17])
@pytest.mark.parametrize("element_size", [2, 4])
def test_tiles_are_powers_of_two(n_cols, element_size):
    config = backward_config(n_cols, element_size)
    for tiles in (forward_tiles(n_cols, element_size), config.tiles, config.dx_tiles or config.tiles):
        for value in (tiles.block_rows, tiles.block_cols, tiles.num_warps):
            assert value >= 1 and value & (value - 1) == 0
        assert tiles.num_stages >= 1
    assert config.programs_per_sm >= 1
    if n_cols <= FORWARD_MAX_BLOCK:  # rows this wide sit whole in registers
        assert forward_tiles(n_cols, element_size).block_cols >= n_cols
    if n_cols <= BACKWARD_MAX_BLOCK:
        assert config.tiles.block_cols >= n_cols


L4_SHARED, A100_SHARED, H100_SHARED = 99 * 1024, 163 * 1024, 227 * 1024  # bytes a program may use


@pytest.mark.parametrize("shared_memory", [L4_SHARED, A100_SHARED, H100_SHARED])
@pytest.mark.parametrize("n_cols", [1, 2, 16, 100, 1024, 4096, 8192, 2**17])
@pytest.mark.parametrize("element_size", [2, 4])
def test_backward_pipeline_fits_the_gpus_shared_memory(n_cols, element_size, shared_memory):
    tiles = backward_config(n_cols, element_size, shared_memory).tiles
    assert pipeline_shared_bytes(tiles, element_size) + SHARED_MEMORY_RESERVE <= shared_memory
    if element_size == 2 and n_cols <= 8192:  # 16 KiB tiles: pipelined on every supported GPU
        assert tiles.num_stages > 1


def test_float32_rows_of_8192_are_pipelined_only_where_they_fit():
    assert backward_config(8192, 4, H100_SHARED).tiles.num_stages > 1
    assert backward_config(8192, 4, A100_SHARED).tiles.num_stages > 1
    assert backward_config(8192, 4, L4_SHARED).tiles.num_stages == 1
