"""Which elements a kernel reads and writes, and a guard against accesses outside its tensors.

The first bug of almost every Triton kernel is a wrong mask. On a GPU it reads garbage or
stops with "illegal memory access"; in Triton's CPU interpreter it reads and writes the
host's heap, and Python dies with ``free(): invalid pointer``, a segfault or a hang, which
in Jupyter is "the kernel died" and nothing else. Under :func:`guard_accesses` every load
and store of an interpreted launch is checked *before* it happens: an address that is not
an element of one of the launch's tensor arguments raises :class:`OutOfBoundsAccess`,
naming the kernel, the pointer argument, load or store, the program id and the first
offending offsets. :func:`record_accesses` keeps what each program read and wrote, and
:func:`draw_accesses` draws it as chapter 1 draws tiles, out-of-bounds lanes marked.

How it works. The interpreter copies a launch's tensor arguments to host memory
(``GridExecutor._init_args_hst``), runs every program one after another and copies the
results back (``_restore_args_dev``); every access goes through
``interpreter_builder.create_masked_load`` / ``create_masked_store`` (plain, block-pointer
and descriptor loads and stores included) or an atomic. The guard replaces these for the
duration of a ``with`` block, in Triton 3.6 to 3.9 alike:

* the host copies are placed in one buffer, each storage with a gap of unused memory on
  both sides, so every address has exactly one nearest tensor (an address past the end
  of ``x`` cannot land inside ``out`` unless it is far past it), and a wrong access is
  blamed on the pointer it ran off;
* every address a load or store would touch with its mask on is looked up among the
  elements of the arguments: an address inside a storage but not an element of the view
  (between the rows of ``x = wide[:, :33]``) counts as out of bounds too.

Why not triton-viz. Its sanitizer (triton-viz 3.0 on PyPI) finds these accesses with
Triton 3.7.1, but fails at import with Triton 3.9.0 (it patches
``create_make_block_ptr``, gone there), must decorate every kernel itself, stops the
process with ``sys.exit`` when asked to raise, and brings z3, pyarrow, flask and
pre-commit with it. The checks here are a few NumPy operations a load.

On a GPU the kernels are compiled and nothing can be checked before an access: the guard
does nothing there (``GUARDED`` is False) unless asked to (``force``). The exercise
checkers ask: they run a student's kernel interpreted first, on a GPU machine as on a
laptop (:mod:`course_lib.teaching.student_kernels`).
"""

import contextlib
import dataclasses
import inspect

import numpy as np
import torch

from ..core.runtime import ON_GPU

GUARDED = not ON_GPU  # only the interpreter's accesses can be checked before they happen
_GAP_BYTES = 1 << 16  # unused memory at least this large on each side of every tensor
_ALIGNMENT = 128
_LISTED = 4  # offending offsets named in a message


class OutOfBoundsAccess(Exception):
    """A load or store would touch memory outside every tensor argument of its launch."""

    def __init__(self, message, access):
        super().__init__(message)
        self.access = access


@dataclasses.dataclass
class Argument:
    """One tensor argument of a launch, placed in the guard's buffer."""

    name: str
    shape: tuple
    strides: tuple
    itemsize: int
    address: int  # of element (0, ..., 0), in the guard's buffer
    sorted_offsets: np.ndarray  # element offsets from ``address``, sorted
    flat_index: np.ndarray  # the flat index of each of them

    def find(self, addresses):
        """(element offsets from the first element, flat index or -1) of byte addresses."""
        relative = addresses.astype(np.int64) - np.int64(self.address)
        offsets = relative // self.itemsize
        if not len(self.sorted_offsets):
            return offsets, np.full(len(offsets), -1, np.int64)
        position = np.searchsorted(self.sorted_offsets, offsets).clip(0, len(self.sorted_offsets) - 1)
        hit = (self.sorted_offsets[position] == offsets) & (relative % self.itemsize == 0)
        return offsets, np.where(hit, self.flat_index[position], -1)

    def describe(self):
        return (f"the tensor passed as {self.name} (shape {self.shape}, strides {self.strides}, "
                f"{int(np.prod(self.shape, dtype=np.int64))} element(s))")


@dataclasses.dataclass
class Access:
    """One load or store of one program: the elements it touched, by argument."""

    program: tuple
    kind: str  # "load" or "store"
    argument: str
    indices: np.ndarray  # flat indices of the elements touched
    outside: np.ndarray  # element offsets (from the argument's first element) outside it
    lanes: np.ndarray  # the tile lanes of ``outside``, one row each


@dataclasses.dataclass
class Launch:
    """One launch: the kernel's name, its grid, its tensor arguments and its accesses."""

    kernel: str
    grid: tuple
    arguments: dict
    accesses: list
    stopped_by: OutOfBoundsAccess = None  # the access that ended the launch, if one did


class _Placement:
    """A launch's host tensors placed in one buffer with gaps; finds the argument of an address."""

    def __init__(self, kernel_name, named_host, named_dev):
        regions, offset = {}, _GAP_BYTES
        for (_, host), (_, dev) in zip(named_host, named_dev):
            storage = host.untyped_storage()
            if storage.data_ptr() not in regions:
                regions[storage.data_ptr()] = (offset, storage, dev.untyped_storage())
                offset += -(-(storage.nbytes() + _GAP_BYTES) // _ALIGNMENT) * _ALIGNMENT
        self.buffer = torch.empty(offset + _GAP_BYTES, dtype=torch.uint8)
        base = self.buffer.data_ptr()
        self.copies_back = []
        for start, storage, dev_storage in regions.values():
            self.buffer[start:start + storage.nbytes()] = torch.empty(0, dtype=torch.uint8).set_(storage)
            self.copies_back.append((start, storage.nbytes(), dev_storage))
        self.kernel = kernel_name
        self.arguments = {}
        sharing = {}  # storage start in the buffer -> the arguments viewing that storage
        for name, host in named_host:
            start = regions[host.untyped_storage().data_ptr()][0]
            host.set_(self.buffer.untyped_storage(), start // host.element_size() + host.storage_offset(),
                      host.size(), host.stride())
            self.arguments[name] = _argument(name, host)
            sharing.setdefault(base + start, []).append(self.arguments[name])
        # An address belongs to the storage nearest to it: the zones split the gaps in the middle.
        starts = sorted(sharing)
        ends = {base + start: base + start + storage.nbytes() for start, storage, _ in regions.values()}
        self.zones = [sharing[start] for start in starts]
        self.zone_starts = np.array([0] + [(ends[a] + b) // 2 for a, b in zip(starts, starts[1:])], dtype=np.uint64)
        self.accesses = []

    def copy_back(self):
        for start, nbytes, dev_storage in self.copies_back:
            torch.empty(0, dtype=torch.uint8, device=dev_storage.device).set_(dev_storage).copy_(
                self.buffer[start:start + nbytes])

    def check(self, kind, pointers, mask, program, recording):
        """Raise OutOfBoundsAccess unless every address switched on by the mask is an element."""
        addresses = np.asarray(pointers, dtype=np.uint64)
        active = np.broadcast_to(np.asarray(mask, dtype=bool), addresses.shape)
        lanes = np.argwhere(active)
        chosen = addresses[active]
        if not self.zones or not len(chosen):
            return
        zones = np.searchsorted(self.zone_starts, chosen, side="right") - 1
        for zone in np.unique(zones):
            in_zone = zones == zone
            found = np.zeros(int(in_zone.sum()), dtype=bool)
            for argument in self.zones[zone]:
                offsets, flat = argument.find(chosen[in_zone])
                matched = (flat >= 0) & ~found
                found |= matched
                if recording and matched.any():
                    self.accesses.append(Access(program, kind, argument.name, flat[matched],
                                                np.empty(0, np.int64), np.empty((0, lanes.shape[1]), np.int64)))
            if found.all():
                continue
            blamed = self.zones[zone][0]  # the first pointer argument into this storage
            offsets, _ = blamed.find(chosen[in_zone])
            access = Access(program, kind, blamed.name, np.empty(0, np.int64), offsets[~found],
                            lanes[in_zone][~found])
            if recording:
                self.accesses.append(access)
            raise OutOfBoundsAccess(_message(self.kernel, blamed, access, addresses), access)


def _argument(name, host):
    """The Argument of a host tensor already placed in the buffer."""
    if host.numel():
        storage_elements = host.untyped_storage().nbytes() // host.element_size() - host.storage_offset()
        offsets = torch.as_strided(torch.arange(storage_elements), host.size(), host.stride()).reshape(-1)
        offsets = offsets.numpy().astype(np.int64)
    else:
        offsets = np.empty(0, np.int64)
    order = np.argsort(offsets, kind="stable")
    return Argument(name, tuple(host.shape), tuple(host.stride()), host.element_size(), host.data_ptr(),
                    offsets[order], order)


def _tile_steps(argument, addresses):
    """How many elements the tile's addresses advance along each of its axes (None where it has one lane)."""
    start = addresses.reshape(-1)[0].astype(np.int64) if addresses.size else np.int64(0)
    steps = []
    for axis, n in enumerate(addresses.shape):
        if n < 2:
            steps.append(None)
            continue
        step = np.take(addresses, 1, axis=axis).reshape(-1)[0].astype(np.int64) - start
        steps.append(int(step) // argument.itemsize)
    return steps


def _why(argument, access, addresses):
    """Which mistake the offending offsets point at: a stride, or a mask."""
    steps = [step for step in _tile_steps(argument, addresses) if step not in (None, 0)]
    strides = set(argument.strides) if len(argument.shape) > 1 else {argument.strides[0]}
    wrong = [step for step in steps if step not in strides]
    if wrong:
        return (f"where no element of it is, because the tile's addresses step {wrong[0]} element(s) along one of "
                f"its axes while {argument.name}'s strides are {argument.strides}: is each index multiplied by "
                "the right stride (a column index by the column stride, a row index by the row stride: "
                "stride_x_row, not n_cols)?")
    if access.outside.min() < 0:
        return "before its first element: is an offset negative (a subtraction, or a program id used wrongly)?"
    if not len(argument.sorted_offsets) or access.outside.max() > argument.sorted_offsets[-1]:
        tile_steps = _tile_steps(argument, addresses)
        if len(argument.shape) == 1 and len(tile_steps) == 2 and tile_steps[0] not in (None, 0) \
                and tile_steps[1] in (None, 0):
            return (f"past its last element, and the tile reads {argument.name} down its rows (axis 0), the "
                    f"same element across each row: is {argument.name} indexed by the row offsets where it "
                    "should be by the column offsets (a vector as long as a row: w_ptr + cols, broadcast as "
                    "w[None, :])?")
        vector = (f" Being a vector, is {argument.name} indexed by the offsets of the axis it runs along (a "
                  "vector as long as a row by the columns, not the rows)?") if len(argument.shape) == 1 else ""
        return ("past its last element: is every lane past the last row or column masked off "
                f"(rows < n_rows and cols < n_cols, not <=), and is the mask given to this {access.kind}?{vector}")
    return ("between its elements, in memory it does not own (the rows of a sliced tensor are further "
            "apart than its width): is each offset multiplied by the right stride (the row stride is "
            "stride_x_row, not n_cols)?")


def _message(kernel, argument, access, addresses):
    outside = access.outside
    listed = ", ".join(str(int(o)) for o in outside[:_LISTED]) + (", ..." if len(outside) > _LISTED else "")
    lanes = ", ".join(str(tuple(int(i) for i in lane)) for lane in access.lanes[:_LISTED])
    verb = "reads" if access.kind == "load" else "writes"
    why = _why(argument, access, addresses)
    tile = " × ".join(str(n) for n in addresses.shape) or "1"
    program = access.program[0] if len(access.program) == 1 else access.program
    return (f"out of bounds: the {access.kind} through {argument.name} in program {program} of {kernel} "
            f"{verb} {len(outside)} element(s) outside {argument.describe()}, at {argument.name} + {listed} "
            f"(elements; lanes {lanes} of the {tile} tile). They lie {why}")


class _Guard:
    """The state of one ``with guard_accesses()`` block."""

    def __init__(self, recording):
        self.recording = recording
        self.placement = None
        self.launches = []
        self.violation = None


_active = []  # the innermost guard is the last


def _named_tensors(name, arg):
    """(name, tensor) for every tensor inside one kernel argument, as the interpreter walks them."""
    from triton.runtime.interpreter import TensorDescriptor, _unwrap_tensor

    if isinstance(arg, tuple):
        for i, item in enumerate(arg):
            yield from _named_tensors(f"{name}[{i}]", item)
    elif isinstance(arg, TensorDescriptor):
        yield from _named_tensors(f"{name}.base", arg.base)
    elif hasattr(arg, "data_ptr"):
        yield name, _unwrap_tensor(arg)


def _launch_tensors(executor, args, kwargs):
    bound = inspect.signature(executor.fn).bind_partial(*args, **kwargs).arguments
    return [pair for name, arg in bound.items() for pair in _named_tensors(name, arg)]


def _program():
    """The program id, with as many axes as the launch's grid has (up to its last axis above 1)."""
    from triton.runtime.interpreter import interpreter_builder

    axes = max([1] + [axis + 1 for axis, n in enumerate(interpreter_builder.grid_dim) if n > 1])
    return tuple(int(i) for i in interpreter_builder.grid_idx[:axes])


def _check(kind, pointers, mask):
    guard = _active[-1]
    if guard.placement is None:
        return
    try:
        guard.placement.check(kind, pointers, mask, _program(), guard.recording)
    except OutOfBoundsAccess as error:
        guard.violation = error
        guard.launches[-1].stopped_by = error
        raise


@contextlib.contextmanager
def guard_accesses(recording=False, force=False):
    """Inside this block, an interpreted load or store outside the launch's tensor arguments
    raises :class:`OutOfBoundsAccess` before it happens (the interpreter reports it as an
    ``InterpreterError`` whose cause it is; the guard's ``violation`` keeps it). Yields the
    guard: ``.launches`` lists every launch, with its accesses if ``recording``.

    On a GPU the block does nothing unless ``force``: there the kernels are compiled, and
    only a kernel the caller interprets on purpose
    (:func:`course_lib.teaching.student_kernels.interpreted`) goes through the interpreter."""
    if _active:  # already guarded: the outer block sees the launches
        _active[-1].recording |= recording
        yield _active[-1]
        return
    guard = _Guard(recording)
    if not (GUARDED or force):
        yield guard
        return
    from triton.runtime import interpreter

    builder, executor = interpreter.interpreter_builder, interpreter.GridExecutor
    saved = {name: builder.__dict__.get(name) for name in
             ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")}
    init_args, restore_args = executor._init_args_hst, executor._restore_args_dev
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store
    atomic_rmw, atomic_cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def placed_init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        placement = _Placement(self.fn.__name__, _launch_tensors(self, args_hst, kwargs_hst),
                               _launch_tensors(self, args_dev, kwargs))
        grid = tuple(self.grid) if isinstance(self.grid, (tuple, list)) else ()
        guard.placement = placement
        guard.launches.append(Launch(self.fn.__name__, grid, placement.arguments, placement.accesses))
        return args_hst, kwargs_hst

    def placed_restore_args(self, args_dev, args_hst, kwargs, kwargs_hst):
        guard.placement.copy_back()
        guard.placement = None

    def load(ptrs, mask, *rest, **options):
        _check("load", ptrs.data, mask.data)
        return masked_load(ptrs, mask, *rest, **options)

    def store(ptrs, value, mask, *rest, **options):
        _check("store", ptrs.data, mask.data)
        return masked_store(ptrs, value, mask, *rest, **options)

    def rmw(op, ptr, value, mask, *rest, **options):
        _check("store", ptr.data, mask.data)
        return atomic_rmw(op, ptr, value, mask, *rest, **options)

    def cas(ptr, compare, value, *rest, **options):
        _check("store", ptr.data, np.ones(np.shape(ptr.data), dtype=bool))
        return atomic_cas(ptr, compare, value, *rest, **options)

    _active.append(guard)
    builder.create_masked_load, builder.create_masked_store = load, store
    builder.create_atomic_rmw, builder.create_atomic_cas = rmw, cas
    executor._init_args_hst, executor._restore_args_dev = placed_init_args, placed_restore_args
    try:
        yield guard
    finally:
        executor._init_args_hst, executor._restore_args_dev = init_args, restore_args
        for name, method in saved.items():
            if method is None:
                builder.__dict__.pop(name, None)
            else:
                setattr(builder, name, method)
        _active.pop()


def record_accesses(fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)`` (a launcher, say) and return what each of its kernel
    launches read and wrote, as a list of :class:`Launch`, one a launch. A launch that
    reached an out-of-bounds access ends there: its ``stopped_by`` says which, and its
    accesses include the offending one. Interpreter only: on a GPU nothing is recorded."""
    if not GUARDED:
        raise RuntimeError("record_accesses needs Triton's CPU interpreter: on a GPU the kernels are compiled, "
                           "and their accesses cannot be seen one by one")
    with guard_accesses(recording=True) as guard:
        try:
            fn(*args, **kwargs)
        except Exception:
            if guard.violation is None:
                raise
    return guard.launches


def _grid_position(argument, offsets):
    """(row, column) of element offsets from the first element, also for offsets outside the
    tensor: where they would sit if its rows (or, column-major, its columns) went on."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(argument.shape) == 1:
        return np.zeros_like(offsets), offsets // max(argument.strides[0], 1)
    row_stride, col_stride = (max(s, 1) for s in argument.strides[-2:])
    if col_stride <= row_stride:
        rows = offsets // row_stride
        return rows, (offsets - rows * row_stride) // col_stride
    cols = offsets // col_stride
    return (offsets - cols * col_stride) // row_stride, cols


def draw_accesses(launch, arguments=None, max_programs_named=10):
    """Draw one :class:`Launch`: a panel for each tensor argument (of 3 or more dimensions,
    its rows stacked), each element
    coloured by the program that touched it, hatched where it was written, and the
    out-of-bounds elements as red crosses where they would lie past the tensor's edge."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    names = [name for name, a in launch.arguments.items() if len(a.shape) >= 1
             and (arguments is None or name in arguments)]
    if not names:
        raise ValueError(f"{launch.kernel}'s launch has no tensor argument of 1 or more dimensions to draw"
                         + (f" among {list(arguments)}" if arguments else ""))
    programs = sorted({access.program for access in launch.accesses})
    number = {program: i for i, program in enumerate(programs)}
    colours = plt.cm.tab10.colors
    # A 1-D argument is drawn as one row; one of 3 or more dimensions as its rows, the
    # leading dimensions stacked (row r of batch b below the rows of batch b - 1).
    shapes = {name: (int(np.prod(launch.arguments[name].shape[:-1])), launch.arguments[name].shape[-1])
              for name in names}
    heights = [min(shapes[name][0], 24) + 4 for name in names]  # a 1-D argument gets a thin panel
    fig, axes = plt.subplots(len(names), 1, figsize=(7.5, 1 + 0.17 * sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, name in zip(axes[:, 0], names):
        argument = launch.arguments[name]
        shape = shapes[name]
        touched = np.full(shape, -1)
        written = np.zeros(shape, dtype=bool)
        outside = []
        for access in launch.accesses:
            if access.argument != name:
                continue
            index = np.unravel_index(access.indices, shape)
            touched[index] = number[access.program]
            written[index] |= access.kind == "store"
            rows, cols = _grid_position(argument, access.outside)
            outside += [(r, c, access.kind) for r, c in zip(rows.tolist(), cols.tolist())]
        row_low = min([0] + [r for r, _, _ in outside])
        row_high = max([shape[0]] + [r + 1 for r, _, _ in outside])
        col_high = max([shape[1]] + [c + 1 for _, c, _ in outside])
        image = np.ma.masked_less(touched, 0) % len(colours)
        ax.pcolormesh(np.arange(shape[1] + 1), np.arange(shape[0] + 1), image,
                      cmap=ListedColormap(colours), vmin=0, vmax=len(colours), edgecolors="grey", linewidth=0.3,
                      alpha=0.85)
        ax.add_patch(plt.Rectangle((0, 0), shape[1], shape[0], fill=False, edgecolor="black", lw=1.5))
        rows, cols = np.nonzero(written & (touched >= 0))
        for r, c in zip(rows.tolist(), cols.tolist()):
            ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, hatch="///", edgecolor="black", lw=0))
        if outside:
            ax.scatter([c + 0.5 for _, c, _ in outside], [r + 0.5 for r, _, _ in outside], marker="x", color="red",
                       s=40, linewidths=2, zorder=3)
        ax.set_xlim(0, col_high)
        ax.set_ylim(row_high, row_low)
        kinds = sorted({a.kind for a in launch.accesses if a.argument == name})
        what = " and ".join({"load": "read", "store": "written (hatched)"}[k] for k in kinds) or "not touched"
        title = f"{name}: {what}"
        if outside:
            title += f"; red x: {len(outside)} out of bounds"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("column" if len(argument.shape) >= 2 else "index")
        ax.set_ylabel("row" if len(argument.shape) >= 2 else "")
        if len(argument.shape) == 1:
            ax.set_yticks([])
    if len(programs) <= max_programs_named:
        fig.legend(handles=[Patch(color=colours[number[p] % len(colours)], label=f"program {p}") for p in programs],
                   loc="center right", fontsize=8)
        fig.subplots_adjust(right=0.78)
    program = launch.stopped_by.access.program if launch.stopped_by else ()
    stopped = (f"\nstopped at the first out-of-bounds access, in program {program[0] if len(program) == 1 else program}"
               if launch.stopped_by else "")
    fig.suptitle(f"{launch.kernel}, grid {launch.grid}: colour = the program that touched an element{stopped}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.78 if len(programs) <= max_programs_named else 1, 1))
    plt.show()
