import pytest
import torch

from course_lib import runtime


def test_describe_names_triton_and_where_kernels_run():
    text = runtime.describe()
    assert "Triton" in text
    assert ("CPU interpreter" in text) != runtime.ON_GPU


def test_device_matches_backend():
    assert runtime.DEVICE.type == ("cuda" if runtime.ON_GPU else "cpu")


def test_old_gpu_falls_back_to_the_interpreter_with_an_explanation(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.warns(UserWarning, match=r"Tesla T4 has compute capability 7.5.*needs 8.0 or newer"):
        use_gpu, reason = runtime._choose_backend()
    assert not use_gpu and "Tesla T4" in reason


def test_no_gpu_and_forced_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime._choose_backend() == (False, "no CUDA GPU was found")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert runtime._choose_backend() == (False, "TRITON_INTERPRET=1 is set")


def test_supported_gpu_is_used(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100")
    assert runtime._choose_backend() == (True, "NVIDIA H100")


@pytest.mark.parametrize("elements, warps", [(1, 1), (256, 1), (1024, 4), (4096, 16), (1 << 20, 16)])
def test_num_warps_for(elements, warps):
    assert runtime.num_warps_for(elements) == warps


def test_host_integer_helpers_agree_with_triton():
    # The launchers' own copies, fast on the host; triton's are the reference.
    import triton

    for n in [0, 1, 2, 3, 4, 5, 7, 8, 9, 1000, 1023, 1024, 1025, 2**31 - 1, 2**31, 2**40 + 3]:
        assert runtime.next_power_of_2(n) == triton.next_power_of_2(n), n
        for block in [1, 2, 3, 16, 1000, 2**31]:
            assert runtime.cdiv(n, block) == triton.cdiv(n, block), (n, block)


@pytest.mark.parametrize("words_a_tile", [1, 4])
@pytest.mark.parametrize("num_warps", [1, 4, 8, 16])
def test_slots_block_keeps_copies_of_a_slot_within_a_warp(num_warps, words_a_tile):
    for n_tiles in range(1, 600):
        block = runtime.slots_block(n_tiles, num_warps, words_a_tile)
        assert block >= n_tiles and block & (block - 1) == 0
        words = block * words_a_tile
        # All of them in one warp, or at least one for every thread of the program.
        assert words <= 32 or words >= 32 * num_warps, (n_tiles, block)
        assert block == runtime.next_power_of_2(n_tiles) or words == 32 * num_warps  # no wider than needed


def test_pick():
    assert runtime.pick(gpu="big", cpu="small") == ("big" if runtime.ON_GPU else "small")


def test_interpreter_refuses_a_triton_imported_too_early(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(runtime, "_REASON", "no CUDA GPU was found")
    # triton is in sys.modules here, as it is after a notebook's `import triton`.
    with pytest.raises(ImportError, match="course_lib must be imported before triton"):
        runtime._select_interpreter()


def test_interpreter_accepts_a_variable_set_in_advance(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    runtime._select_interpreter()
