"""The checkers of chapter 7 (course_lib/teaching/exercises/chapter7/) pass a right answer and name each typical mistake."""

import pytest

from course_lib.teaching import exercises
from course_lib.teaching.checking import ExerciseError
from solutions import solution
from hidden_sizes import hidden_sizes  # noqa: F401  (autouse: visible and hidden sizes)


def _add_routed_rows(mistakes=None):
    return solution("07_routed_block", "7.1", mistakes).add_routed_rows_kernel


def test_add_routed_rows_checker(capsys):
    exercises.check_add_routed_rows(_add_routed_rows())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 7.1 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda light, heavy, indices: light.index_add(1, indices[0], heavy), "pass the kernel itself"),
    (None, "got None"),
])
def test_add_routed_rows_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_add_routed_rows(answer)


@pytest.mark.parametrize("mistake, message", [
    # the positions used as offsets, not multiplied by the row stride
    ({"positions[:, None] * stride_out_n": "positions[:, None]"}, "not an address"),
    ({"b * stride_out_b + positions": "positions"}, "added into the first sequence"),
    ({"light + heavy, mask=mask": "heavy, mask=mask"}, "the heavy rows alone"),  # an overwrite, not an addition
    # no mask on the routed tokens of the last tile: rows past num_routed
    ({"mask = is_routed[:, None] & (cols < dim)[None, :]": "mask = (cols < dim)[None, :]"}, "out of bounds"),
    ({"routed, mask=is_routed, other=0)": "routed)"}, "out of bounds"),  # the positions' load unmasked
    # heavy read as if contiguous
    ({"routed[:, None] * stride_heavy_k": "routed[:, None] * dim"}, "rows are 40 elements apart|out of bounds"),
    # right only up to the printed cases' sizes
    ({"tl.store(rows, light + heavy, mask=mask)": "if num_routed < 100:\n        tl.store(rows, light + heavy, mask=mask)"},
     "300 tokens of width 70, 130 routed"),
])
def test_add_routed_rows_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_add_routed_rows(_add_routed_rows(mistake))


def _local_attention(mistakes=None):
    return solution("07_routed_block", "7.2", mistakes).local_attention_forward_kernel


def test_local_attention_forward_checker(capsys):
    exercises.check_local_attention_forward(_local_attention())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 7.2 passed") and "speed" in out


def test_bfloat16_arithmetic_gets_a_gpus_verdict_under_the_interpreter():
    # scale is a float argument, a float32 scalar in a compiled kernel: q * scale is float32 and
    # tl.dot refuses it beside the bfloat16 keys (on an H200: "CompilationError: Both operands
    # must be same dtype. Got fp32 and bf16"). The interpreter kept the float a Python number,
    # which took q's dtype, and computed; now it takes it as a GPU does, and refuses the same way.
    with pytest.raises(ExerciseError, match=r"Both operands must be same dtype\. Got fp32 and bf16"):
        exercises.check_local_attention_forward(
            _local_attention({"tl.dot(q, tl.trans(k)) * scale": "tl.dot(q * scale, tl.trans(k))"}))


@pytest.mark.parametrize("answer, message", [
    (lambda q, k, v, window: q, "pass the kernel itself"),
    (None, "got None"),
])
def test_local_attention_forward_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_local_attention_forward(answer)


@pytest.mark.parametrize("mistake, message", [
    ({"running_sum = running_sum * alpha +": "running_sum = running_sum +"}, "running sum is not rescaled"),
    ({"acc = acc * alpha[:, None] +": "acc = acc +"}, "accumulator is not rescaled"),
    ({"running_sum = running_sum * alpha +": "running_sum = running_sum +",
      "acc = acc * alpha[:, None] +": "acc = acc +"}, "running sum and accumulator are not rescaled"),
    ({"keys[None, :] <= queries[:, None]": "keys[None, :] < queries[:, None]"}, "diagonal is hidden"),
    ({"> queries[:, None] - window": ">= queries[:, None] - window"}, "one key too wide"),  # i - window <= j
    ({'tl.where(visible, scores, float("-inf"))': "tl.where(visible, scores, 0.0)"}, "set the hidden scores to -inf"),
    ({"tl.dot(q, tl.trans(k)) * scale": "tl.dot(q, tl.trans(k))"}, "multiply the scores by scale"),
    ({'shift = tl.where(new_max == float("-inf"), 0.0, new_max)': "shift = new_max"}, r"exp\(-inf - \(-inf\)\)"),
    # key tiles before the sequence: the loop not clamped at key 0, the loads masked past the end only
    ({"tl.maximum(start_q - window + 1, 0)": "start_q - window + 1"}, "out of bounds"),
    # key tiles past the end read unmasked
    ({"mask=(keys < seq_len)[:, None], other=0.0)\n        v =": ")\n        v ="}, "out of bounds"),
    # q read as if contiguous
    ({"queries[:, None] * stride_q_n": "queries[:, None] * HEAD_DIM"}, "rows are 48 elements apart|out of bounds"),
    # the loop over key tiles stops before the tile that holds the diagonal
    ({"tl.minimum(start_q + BLOCK_Q, seq_len)": "start_q"}, "stops before the keys on the diagonal"),
    # the running max started at 0: scores far below 0 give exp(score) = 0 and 0 / 0
    ({'running_max = tl.full((BLOCK_Q,), float("-inf"), tl.float32)': "running_max = tl.zeros((BLOCK_Q,), tl.float32)"},
     "(?s)scores near -144.*hint: .*start at -inf"),
    # writes only where the output held NaN beforehand (bfloat16 compared as float32: the interpreter
    # compares bfloat16 values as the integers it keeps them as)
    ({"tl.store(out_ptr + bh * stride_out_bh + queries[:, None] * stride_out_n\n             + dims[None, :], "
      "(acc / running_sum[:, None]).to(tl.bfloat16),":
      "old = tl.load(out_ptr + bh * stride_out_bh + queries[:, None] * stride_out_n + dims[None, :], "
      "mask=(queries < seq_len)[:, None])\n    tl.store(out_ptr + bh * stride_out_bh + queries[:, None] * stride_out_n"
      "\n             + dims[None, :], tl.where(old.to(tl.float32) != old.to(tl.float32), "
      "(acc / running_sum[:, None]).to(tl.bfloat16), old),"},
     "still hold what the output held before the launch"),
    # right only up to the printed cases' lengths
    ({"(acc / running_sum[:, None]).to(tl.bfloat16),\n             mask=(queries < seq_len)[:, None])":
      "(acc / running_sum[:, None]).to(tl.bfloat16),\n"
      "             mask=(queries < seq_len)[:, None] & (queries < 100)[:, None])"},
     "1 head of 150 tokens"),
    # the log-sum-exp without the maximum, and in base 2
    ({"running_max + tl.log(running_sum)": "tl.log(running_sum)"}, "lse.*\n(.*\n)*.*lacks the maximum"),
    ({"running_max + tl.log(running_sum)": "(running_max + tl.log(running_sum)) * 1.4426950408889634"},
     "lse.*\n(.*\n)*.*in base 2"),
])
def test_local_attention_forward_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_local_attention_forward(_local_attention(mistake))


def _local_attention_backward(mistakes=None):
    return solution("07_routed_block", "7.3", mistakes).local_attention_backward_kernel


def test_local_attention_backward_checker(capsys):
    exercises.check_local_attention_backward(_local_attention_backward())
    out = capsys.readouterr().out
    assert out.startswith("Exercise 7.3 passed") and "speed" in out


@pytest.mark.parametrize("answer, message", [
    (lambda q, k, v, out, grad_out, lse, window: (q, k, v), "pass the kernel itself"),
    (None, "got None"),
])
def test_local_attention_backward_refuses_what_is_not_a_kernel(answer, message):
    with pytest.raises(ExerciseError, match=message):
        exercises.check_local_attention_backward(answer)


# The hints' messages, each matched with the hint line so that no other hint can pass for it.
DELTA = "dS lacks the - D"
SCALE_BOTH, SCALE_DK = "dq and dk are 1/scale times too large", "dk is \\(dq is right\\) 1/scale times too large"
# The scale left out of dS and put back on dq alone: dk lacks it.
SCALE_ON_DQ_ONLY = {"(grad_p - delta[:, None]) * scale": "(grad_p - delta[:, None])",
                    "grad_q += tl.dot(grad_scores.to(k.dtype), k)": "grad_q += tl.dot(grad_scores.to(k.dtype), k) * scale"}


@pytest.mark.parametrize("mistake, message", [
    ({"(grad_p - delta[:, None])": "grad_p"}, DELTA),
    ({"(grad_p - delta[:, None]) * scale": "(grad_p - delta[:, None])"}, SCALE_BOTH),
    (SCALE_ON_DQ_ONLY, SCALE_DK),
    ({"tl.exp(scores - lse[:, None])": "tl.exp(scores)"}, "without the saved log-sum-exp"),
    ({"tl.exp(scores - lse[:, None])": "tl.exp2(scores * 1.4426950408889634 - lse[:, None])"}, "P mixes bases"),
    ({"keys[None, :] <= queries[:, None]": "keys[None, :] < queries[:, None]"}, "diagonal is hidden in the backward"),
    ({"> queries[:, None] - window": ">= queries[:, None] - window"}, "backward's window is one key too wide"),
    ({"& (keys[None, :] > queries[:, None] - window)": ""}, "keys before the window count in the backward"),
    ({"tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)": "tl.exp(scores - lse[:, None])"}, "nothing is hidden"),
    # the pass over key tiles walks the forward's key range, before the tile, instead of the queries after it
    ({"range(start_k, query_end, BLOCK_Q)": "range(tl.maximum(start_k - window + 1, 0), "
                                            "tl.minimum(start_k + BLOCK_K, seq_len), BLOCK_Q)"},
     "not over the forward's key range"),
    # ... and stops at its first key's last query
    ({"start_k + BLOCK_K - 1 + window": "start_k + window"}, "later keys miss their last queries"),
    ({"tl.minimum(start_q + BLOCK_Q, seq_len)": "start_q"}, "dq misses the keys on the diagonal"),
    # key rows past the end read unmasked
    ({"mask=(rows < seq_len)[:, None], other=0.0)": ")"}, "out of bounds"),
    # writes only where the gradient held NaN beforehand
    ({"grad_q.to(tl.bfloat16), mask=in_sequence[:, None])":
      "tl.where(old.to(tl.float32) != old.to(tl.float32), grad_q.to(tl.bfloat16), old), "
      "mask=in_sequence[:, None])",
      "tl.store(grad_q_ptr": "old = tl.load(grad_q_ptr + grad_head + queries[:, None] * stride_grad_n, "
                             "mask=in_sequence[:, None])\n        tl.store(grad_q_ptr"},
     "still hold what the output held before the launch"),
    # right only up to the printed cases' lengths
    ({"grad_q.to(tl.bfloat16), mask=in_sequence[:, None])":
      "grad_q.to(tl.bfloat16), mask=in_sequence[:, None] & (queries < 100)[:, None])"}, "1 head of 150 tokens"),
])
def test_local_attention_backward_names_the_mistake(mistake, message):
    with pytest.raises(ExerciseError, match=message) as error:
        exercises.check_local_attention_backward(_local_attention_backward(mistake))
    assert str(error.value).count("hint:") <= 1
