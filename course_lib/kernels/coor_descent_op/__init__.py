"""Coordinate descent for CoLT5's router: a smoothed top-k over the last dimension.

Chapter 4. A rebuild of CoLT5-attention's ``triton_coor_descent``, with the same
signature and the semantics of its PyTorch ``coor_descent`` (``references.coor_descent``).
Given scores s (..., n) and a budget k, the router iterates, with eps falling from
eps_init to eps by eps_decay (ε-scaling),

    a = eps_t * (log k - logsumexp((s + b) / eps_t)),    b = -relu(s + a),

and returns y = exp((s + a + b) / eps_final): near 1 for about the k largest scores of a
row, near 0 elsewhere, summing to about k.

The reformulation
-----------------
Since b = -relu(s + a), s + b = s - relu(s + a) = min(s, -a). Once a is known, so is
b: the state of a row is one scalar. With a_t the value after iteration t,

    a_1     = eps_0 * (log k - log n_valid)         (b = -s at the start: s + b = 0)
    a_{t+1} = eps_t * log k - eps_t * LSE_j(min(s_j, -a_t) / eps_t)          t >= 1
    y_j     = exp(min(s_j + a_T, 0) / eps_T)

where LSE runs over the unmasked j and n_valid counts them. The seed kept b, a whole
row, per checkpoint; here the forward saves a_1 .. a_T (rows x n_iters scalars) and the
backward replays the recurrence from them.

The backward, by reverse mode through the scalar recurrence (PyTorch's relu'(0) = 0,
so at a tie s_j = -a_t the min counts as taking s_j):

    output:     dw_j = dy_j * y_j / eps_T * [s_j + a_T <= 0];   ds_j = dw_j;   g_T = sum_j dw_j
    step t = T-1 .. 1, with g_{t+1} the gradient reaching a_{t+1}:
                p_j = softmax_j(min(s, -a_t) / eps_t)
                    = exp((min(s_j, -a_t) + a_{t+1}) / eps_t - log k)   (no sum: the
                      saved a_{t+1} already holds the normaliser)
                ds_j  -= g_{t+1} * p_j * [s_j <= -a_t]       (where the min took s_j)
                g_t    = g_{t+1} * sum_j p_j * [s_j > -a_t]  (where it took -a_t)
                dlogk += g_{t+1} * eps_t
    step 0:     dlogk += g_1 * eps_0                         (a_1 does not depend on s)

One pass over the row per iteration, so the backward is linear in n_iters; the seed
replays each segment from its start for every step, quadratic. Masked positions take
no part and get exactly 0 in y and ds. ``checkpoint_segments`` is accepted for
compatibility and has no effect: there is nothing left to checkpoint.

Precision
---------
y divides s + a by eps, so an error in a of one float32 rounding (6e-8 |a|) becomes
6e-8 |a| / eps in y: 4e-6 for |a| = 2, eps = 0.03, as much as PyTorch's own float32
run loses. So a, a scalar per row, is kept in float64, and the elementwise work, all
float32, is done relative to a frame f: min(s, -a) = f + min(s - f, c), with f the
float32 number nearest to -a (or the row max, if lower) and c = -a - f, tiny. Only
small differences get rounded. The row max also keeps the exponentials from
underflowing when a whole row lies far below -a.

The log in a = eps * (log k - log T) - f needs no float64: T, a float32 sum, is already
uncertain in its last bits, and a float32 log adds an error of the same kind, about
|log T| * 6e-8 (log T <= log n). Multiplied by eps in a, it is divided by the same eps
in y and in the backward's p: a relative error of about 1e-6 at worst, whatever eps. A
float64 log, a long chain of float64 operations on every iteration's critical path,
would make the forward markedly slower for nothing.

Filling the GPU
---------------
A row of up to ROW_BLOCK_MAX columns is one program that reads s once, keeps it in
registers through every iteration and writes y once. Longer rows, or few long rows,
are split across programs, one tile each. In the forward each iteration needs a sum
over the whole row: every program publishes its tile's part tagged with the
iteration's number, waits until all tiles of its row have published, and adds them up
in a fixed order (so all tiles get the same a, and runs repeat bit for bit): the
protocol of ``split_rows``, which chapter 3's wide LayerNorm backward uses too.
On a GPU one launch runs every iteration, all programs resident at once: the launch is
cooperative, so CUDA starts it only when every program can be resident, whatever else
shares the GPU, and refuses it otherwise. The interpreter runs programs one after
another, so there each step is a launch of its own, as on a GPU when a row has more
tiles than there are multiprocessors, when CUDA refuses the cooperative launch, and
under torch.compile (whose launches are not cooperative). In the
backward the sums do not depend on the gradient flowing back, so a first kernel
computes every tile's part of the sums of all iterations, and a second writes ds.

Modules: ``kernels``, the Triton kernels; ``launchers``, the plans that pick tiles and
grids and the host functions that launch the kernels; ``function``, the operator that
autograd and torch.compile run and the public ``coor_descent``; ``checks``, its input checks.
"""

# Beside the public function: what the benchmarks (floor.py, tune_coor_descent.py), chapter 4's
# notebook, the router (check_eps_schedule) and the tests of every kernel (TUNED_ON, the operator) read.
from .checks import check_eps_schedule
from .function import COOR_DESCENT, coor_descent
from .kernels import coor_descent_backward_kernel, coor_descent_forward_kernel, step_back, tile_part
from .launchers import (BACKWARD_MAX_REGISTERS, TUNED_ON, BackwardPlan, ForwardPlan, Schedule, backward_plan,
                        coor_descent_backward, coor_descent_forward, eps_schedule, forward_plan, make_eps_schedule)

__all__ = ["coor_descent"]
