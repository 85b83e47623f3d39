"""Pallas backends: ``pallas`` (TPU Mosaic, GPU Triton) and ``pallas-interpret`` (CPU).

Two programs lower a :class:`~jask.graph.op.BlockParallelOp` to ``pl.pallas_call``.

*The executor's seam*, :meth:`PallasBackend.output_tile`, computes one output
tile from the entries ``index_map`` listed for it. Entries are fetched in
chunks of at most :data:`MAX_CHUNK` (fewer when the memory budget is tight,
see :func:`chunk_size`), so a sum over every block of a huge array never holds
more than one chunk. Within a chunk, entries are grouped by block shapes:
ragged edge blocks form their own groups and run as their own ``pallas_call``,
so nothing is padded and padding cannot leak. Each group's blocks are stacked
along a new leading axis and run as one call::

    grid (C,) "arbitrary"; input i: BlockSpec((squeezed, *block_i), lambda k: (k, 0, ...))
    output: the tile, constant along k; init at k == 0, fold with ``combine`` after.

Chunk and group results are folded on the host with the op's ``combine``
(which must therefore be associative and commutative, as every jask op's is).
On GPU (Triton) grid programs run in parallel, so the fold over a chunk is an
in-kernel loop instead, and a ragged group whose blocks are not powers of two
(which Triton cannot express) runs through the jitted per-tile functions.

*The window program*, :func:`window_call`, runs an op over whole in-memory
arrays as a single ``pallas_call`` with grid ``(*out_grid, K)``: each input's
BlockSpec index map calls the op's ``index_map`` on the traced output indices
and selects entry ``k`` (``lax.select_n``). An ``index_map`` that cannot be
traced (Python control flow on indices, dict lookups such as ``GradOp``'s), or
that lists many entries, is tabulated on the host and passed as scalar-prefetch
tables. Ragged edges are read from out of bounds and masked to zero inside the
kernel, which is exact for ops where zero-filled input contributes nothing to
the valid part of the output (elementwise ops, transposes, matmuls, sums).

Low-precision float partials (bf16, f16) are accumulated in float32 and cast to
the output dtype once.
"""
from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jask.kernels.window import widen_dtype

MAX_CHUNK = 16        # entries per pallas_call in output_tile
CHUNK_BUDGET_SHARE = 16  # a chunk's blocks (fetched + stacked copy) use at most budget / this
MAX_SELECT = 64       # window_call: entries selected in-trace; more are tabulated
SQUEEZED = getattr(pl, "squeezed", None)  # a block dim of size 1, dropped in the kernel's ref


# ---------------------------------------------------------------- platform facts

def _tpu():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu


def _compiler_params(platform, semantics):
    """Grid semantics for Mosaic TPU (also accepted in interpret mode); None elsewhere."""
    if platform not in ("tpu", "interpret"):
        return None
    pltpu = _tpu()
    cls = getattr(pltpu, "CompilerParams", None) or getattr(pltpu, "TPUCompilerParams")
    return cls(dimension_semantics=tuple(semantics))


def _smem_spec():
    """A whole small array in scalar memory (scalar operands, index tables)."""
    return pl.BlockSpec(memory_space=_tpu().SMEM)


def current_platform() -> str:
    """``tpu``, ``gpu`` or ``cpu``: where ``pallas`` (non-interpret) would compile."""
    p = jax.default_backend()
    return "gpu" if p in ("gpu", "cuda", "rocm") else p


accumulator_dtype = widen_dtype   # float32 for low-precision floats (bf16, f16), else the dtype itself


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def block_shape_problem(shape, block, dtype, platform: str) -> str | None:
    """Why ``block`` is not a legal Pallas block of an array of ``shape`` on ``platform`` (None if legal).

    TPU (Mosaic): the last two block dims are multiples of (8, 128) or equal the
    array's dims. GPU Triton: every block dim is a power of two. Mosaic GPU
    (``platform="mosaic_gpu"``): the minor block dim spans a multiple of 16 bytes.
    """
    shape, block = tuple(shape), tuple(block)
    if platform == "tpu":
        for axis, unit in ((-1, 128), (-2, 8)):
            if len(block) >= -axis and block[axis] % unit and block[axis] != shape[axis]:
                return (f"TPU blocks need the last two dims to be multiples of (8, 128) or the full "
                        f"array dims; dim {len(block) + axis} is {block[axis]} of {shape[axis]}")
    elif platform == "gpu":
        bad = [b for b in block if not _pow2(b)]
        if bad:
            return f"Triton blocks need power-of-two dims; got {bad}"
    elif platform == "mosaic_gpu":
        if block and (block[-1] * jnp.dtype(dtype).itemsize) % 16:
            return (f"Mosaic GPU blocks need the minor dim to span a multiple of 16 bytes; "
                    f"{block[-1]} x {jnp.dtype(dtype).itemsize} bytes does not")
    return None


def check_block_shape(name, shape, block, dtype, platform) -> None:
    problem = block_shape_problem(shape, block, dtype, platform)
    if problem:
        raise ValueError(f"{name}: block shape {tuple(block)} is illegal for an array of shape "
                         f"{tuple(shape)} on {platform}: {problem}")


def legal_block_shape(shape, dtype, platform: str, tile: int) -> tuple[int, ...]:
    """The block of edge about ``tile`` that ``platform`` accepts for an array of ``shape``."""
    shape = tuple(shape)
    block = [min(tile, d) for d in shape]
    if platform == "tpu":
        for axis, unit in ((-1, 128), (-2, 8)):
            if len(block) >= -axis and block[axis] != shape[axis]:
                block[axis] = min(max(unit, block[axis] // unit * unit), shape[axis])
    elif platform == "gpu":
        block = [2 ** int(math.log2(b)) for b in block]
    elif platform == "mosaic_gpu" and block:
        unit = max(1, 16 // jnp.dtype(dtype).itemsize)
        if block[-1] != shape[-1] or block[-1] % unit:
            block[-1] = max(unit, block[-1] // unit * unit)
    return tuple(block)


# ---------------------------------------------------------------- the seam: one output tile

def chunk_size(entry_bytes: int) -> int:
    """Entries per ``pallas_call``: up to MAX_CHUNK, within 1/CHUNK_BUDGET_SHARE of the budget.

    A chunk holds its fetched blocks and their stacked copy (2 x entry bytes per
    entry) on top of what the planner projected for one entry at a time.
    """
    from jask.config import config
    fit = config.memory_budget // (CHUNK_BUDGET_SHARE * 2 * max(entry_bytes, 1))
    return int(min(MAX_CHUNK, max(1, fit)))


def _signature(blocks):
    """Group key of one entry: per input, ``None`` for a scalar operand, else its block shape; dtypes."""
    return tuple((None if np.ndim(b) == 0 else tuple(np.shape(b)), jnp.result_type(b)) for b in blocks)


def _stack(values):
    if all(isinstance(v, (np.ndarray, np.generic)) for v in values):
        return np.stack(values)
    return jnp.stack([jnp.asarray(v) for v in values])


def _as_acc(x, acc_dtype, shape):
    x = jnp.asarray(x).astype(acc_dtype)
    return jnp.broadcast_to(x, shape) if x.ndim == 0 else x.reshape(shape)


class PallasKernel:
    """The Pallas programs of one op instance, compiled once per block shapes and chunk length."""

    def __init__(self, op, platform: str, interpret: bool):
        self.op = op
        self.name = type(op).__name__
        self.platform = platform
        self.interpret = interpret
        self.program = jax.jit(self._chunk_program, static_argnums=0)
        self.combine = jax.jit(op.combine)
        self.forward = jax.jit(op.forward_block)
        self._legal: dict = {}

    # One group of entries with equal block shapes -> the combined partial, in the accumulator dtype.
    def _chunk_program(self, scalars, *stacked):
        op = self.op
        n = stacked[0].shape[0]
        blocks = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in stacked]
        part = jax.eval_shape(op.forward_block, *blocks)
        acc_dtype = accumulator_dtype(part.dtype)
        tile = part.shape or (1, 1)
        if self.platform == "gpu" and not self.interpret:
            return self._chunk_program_gpu(scalars, stacked, part, acc_dtype, tile)

        def kernel(*refs):
            *in_refs, o_ref = refs
            k = pl.program_id(0)
            vals = [r[k] if s else r[...] for r, s in zip(in_refs, scalars)]
            p = _as_acc(op.forward_block(*vals), acc_dtype, tile)

            @pl.when(k == 0)
            def _init():
                o_ref[...] = p

            @pl.when(k > 0)
            def _fold():
                o_ref[...] = _as_acc(op.combine(o_ref[...], p), acc_dtype, tile)

        in_specs = [_smem_spec() if s else
                    pl.BlockSpec((SQUEEZED, *x.shape[1:]), functools.partial(_stacked_index, x.ndim - 1))
                    for x, s in zip(stacked, scalars)]
        out = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(tile, acc_dtype),
            grid=(n,),
            in_specs=in_specs,
            out_specs=pl.BlockSpec(tile, lambda k: (0,) * len(tile)),
            compiler_params=_compiler_params("interpret" if self.interpret else self.platform, ["arbitrary"]),
            interpret=self.interpret,
            name=f"jask_{self.name}",
        )(*stacked)
        return out.reshape(part.shape)

    def _chunk_program_gpu(self, scalars, stacked, part, acc_dtype, tile):
        """Triton: grid programs run in parallel, so the fold over entries is an in-kernel loop.

        The stacked axis is padded to a power of two (rows past ``n`` are never read).
        """
        op = self.op
        n = stacked[0].shape[0]
        n2 = 1 << (n - 1).bit_length()
        stacked = [jnp.pad(x, [(0, n2 - n)] + [(0, 0)] * (x.ndim - 1)) for x in stacked]

        def kernel(*refs):
            *in_refs, o_ref = refs
            acc = None
            for k in range(n):
                p = _as_acc(op.forward_block(*[r[k] for r in in_refs]), acc_dtype, tile)
                acc = p if acc is None else _as_acc(op.combine(acc, p), acc_dtype, tile)
            o_ref[...] = acc

        out = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(tile, acc_dtype),
            in_specs=[pl.BlockSpec(x.shape, functools.partial(_zeros_index, x.ndim)) for x in stacked],
            out_specs=pl.BlockSpec(tile, functools.partial(_zeros_index, len(tile))),
            name=f"jask_{self.name}",
        )(*stacked)
        return out.reshape(part.shape)

    def legal_on_platform(self, sig) -> bool:
        """Whether one group's blocks (and its partial) are legal Pallas blocks here."""
        if self.interpret or self.platform != "gpu":
            return True   # stacked blocks span their arrays' full dims, which TPU always accepts
        if sig not in self._legal:
            blocks = [jax.ShapeDtypeStruct(shape or (), dtype) for shape, dtype in sig]
            part = jax.eval_shape(self.op.forward_block, *blocks)
            self._legal[sig] = all(all(_pow2(d) for d in shape or ()) for shape in
                                   [s for s, _ in sig] + [part.shape])
        return self._legal[sig]

    def run_group(self, sig, group):
        """Fold one group of fetched entries (equal block shapes) into one partial."""
        if not self.legal_on_platform(sig):
            # A ragged edge Triton cannot express: exact per-entry XLA fallback.
            acc = None
            for blocks in group:
                p = jnp.asarray(self.forward(*blocks))
                p = p.astype(accumulator_dtype(p.dtype))
                acc = p if acc is None else self.combine(acc, p)
            return acc
        scalars = tuple(shape is None for shape, _ in sig)
        stacked = [_stack([blocks[i] for blocks in group]) for i in range(len(sig))]
        return self.program(scalars, *stacked)

    def jaxpr(self, *blocks):
        """The jaxpr of this op's tile program for one entry of ``blocks`` (for inspection and tests)."""
        scalars = tuple(np.ndim(b) == 0 for b in blocks)
        stacked = [_stack([b]) for b in blocks]
        return jax.make_jaxpr(self._chunk_program, static_argnums=0)(scalars, *stacked)


def _stacked_index(ndim, k):
    return (k,) + (0,) * ndim


def _zeros_index(ndim):
    return (0,) * ndim


class PallasBackend:
    """``pallas`` (compiled for the local TPU or GPU) or ``pallas-interpret`` (CPU, for CI)."""

    def __init__(self, interpret: bool):
        self.interpret = interpret
        self.name = "pallas-interpret" if interpret else "pallas"

    def platform(self) -> str:
        if self.interpret:
            return "interpret"
        p = current_platform()
        if p not in ("tpu", "gpu"):
            raise RuntimeError(
                f"jask backend 'pallas' compiles for TPU (Mosaic) or GPU (Triton), but JAX's default "
                f"platform is {p!r}; use backend 'xla' (or 'auto') here, or 'pallas-interpret' to "
                "check the Pallas lowering on CPU")
        return p

    def check_settings(self, label: str = "jask") -> None:
        """Refuse, before any tile is read, settings this backend cannot honour here (``label``: the ops)."""
        from jask.config import config
        if self.platform() == "gpu" and config.tile is not None and not _pow2(config.tile):
            raise ValueError(f"{label}: tile {config.tile} set with jask.config.update('tile', ...) "
                             "is illegal for Pallas on GPU (Triton needs power-of-two blocks); "
                             "choose a power of two")

    def compile(self, op) -> PallasKernel:
        self.check_settings(getattr(op, "label", type(op).__name__.lower()))
        return PallasKernel(op, self.platform(), self.interpret)

    def target(self) -> str:
        """Whose rules window programs follow: ``tpu`` (also in interpret mode) or ``gpu``."""
        return "tpu" if self.interpret else self.platform()

    def compile_window(self, op, spec):
        """The jitted window program ``(stacks, table, valid) -> (n_tiles, *out_block)`` of ``op``.

        One ``pallas_call`` per call (see :mod:`jask.kernels.pallas_window`).
        Raises :class:`~jask.kernels.legality.WindowNotLegal` when this
        platform cannot run the window: run the ``xla`` program for it.
        """
        from jask.kernels.pallas_window import window_program
        return jax.jit(window_program(op, spec, self.target(), self.interpret))

    def max_tile_edge(self, dtypes, n_leaves: int) -> int | None:
        """Largest power-of-two tile edge at which any window program is legal here (None: no limit).

        ``pallas-interpret``: None. TPU: whole tiles within the VMEM budget (512
        for two float32 leaves). GPU (Triton): 128. Pointwise and plain 2-D
        matmul programs are legal at any larger tile (split into inner blocks);
        see :func:`jask.kernels.legality.max_tile_edge`.
        """
        from jask.kernels import legality
        return legality.max_tile_edge("interpret" if self.interpret else self.target(), dtypes, n_leaves)

    def output_tile(self, kernel: PallasKernel, entries, fetch, out_dtype, kernel_of=None):
        pick = (lambda entry: kernel) if kernel_of is None else kernel_of
        fetched = ((pick(e), fetch(e)) for e in entries)
        first = next(fetched, None)
        if first is None:
            return None
        size = chunk_size(sum(b.nbytes for b in first[1] if np.ndim(b)))
        chunk = [first] + list(itertools.islice(fetched, size - 1))
        acc = None
        while chunk:
            groups: dict = {}
            for k, blocks in chunk:
                groups.setdefault((id(k), _signature(blocks)), (k, []))[1].append(blocks)
            for (_, sig), (k, group) in groups.items():
                p = k.run_group(sig, group)
                acc = p if acc is None else k.combine(acc, p)
            del chunk, groups  # let this chunk's blocks go before the next one is fetched
            chunk = list(itertools.islice(fetched, size))
        return jnp.asarray(acc).astype(out_dtype)


# ---------------------------------------------------------------- the window program

class IndexMapNotTraceable(Exception):
    """An op's index_map failed on traced indices; the message says why."""


def _entries_traced(op, n_out, in_ndims):
    """Trace ``op.index_map`` on int32 tracers; return K, or raise with the reason it cannot be traced."""
    def probe(*idx):
        return _normalize_entries(op, op.index_map(tuple(idx)), in_ndims)

    try:
        out = jax.eval_shape(probe, *[jax.ShapeDtypeStruct((), jnp.int32)] * n_out)
    except Exception as e:  # noqa: BLE001 - any failure to trace means: tabulate
        raise IndexMapNotTraceable(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    return len(out)


def _normalize_entries(op, entries, in_ndims):
    name = type(op).__name__
    entries = list(entries)
    for e in entries:
        if len(e) != len(in_ndims) or any(len(b) != nd for b, nd in zip(e, in_ndims)):
            raise ValueError(f"{name}.index_map must give, per entry, one block index of the input's "
                             f"rank per input ({in_ndims}); got {e!r}")
    return [tuple(tuple(jnp.asarray(i, jnp.int32) for i in b) for b in e) for e in entries]


def _tabulate(op, out_grid, in_ndims, out_offset, in_offsets):
    """Host tables: ``idx[lin, k, j]`` block index j (inputs' dims concatenated), ``count[lin]``.

    Indices are relative to the window: ``out_offset`` is added to the window's
    output tile index, ``in_offsets`` subtracted from the input block indices.
    """
    name = type(op).__name__
    rows = []
    shift = [o for offs in in_offsets for o in offs]
    for out_idx in np.ndindex(*out_grid):
        out_idx = tuple(int(i) + o for i, o in zip(out_idx, out_offset))
        entries = list(op.index_map(out_idx))
        for e in entries:
            if len(e) != len(in_ndims) or any(len(b) != nd for b, nd in zip(e, in_ndims)):
                raise ValueError(f"{name}.index_map({out_idx}) must give one block index of the input's "
                                 f"rank per input ({in_ndims}); got {e!r}")
        rows.append([[int(i) - s for i, s in zip((i for b in e for i in b), shift)] for e in entries])
    k_max = max(1, max(len(r) for r in rows))
    width = sum(in_ndims)
    table = np.zeros((len(rows), k_max, width), np.int32)
    for lin, r in enumerate(rows):
        if r:
            table[lin, :len(r)] = r
            table[lin, len(r):] = r[-1]  # repeat the last entry: same block, no new copy
    count = np.asarray([len(r) for r in rows], np.int32)
    return table, count, k_max


class WindowIndex:
    """Where input blocks come from at each grid point ``(*out_idx, k)`` of a window program.

    Traced: ``op.index_map`` runs on the traced output indices and ``lax.select_n``
    picks entry ``k``. Tabulated: ``table``/``count`` are scalar-prefetch operands;
    entries past an output tile's count repeat its last entry and are skipped.
    """

    def __init__(self, op, out_grid, in_ndims, mode: str, platform: str, out_offset=None, in_offsets=None):
        self.op, self.out_grid, self.in_ndims = op, tuple(out_grid), list(in_ndims)
        self.out_offset = tuple(out_offset or (0,) * len(out_grid))
        self.in_offsets = [tuple(o or (0,) * nd) for o, nd in zip(in_offsets or [None] * len(in_ndims), in_ndims)]
        self.offsets = [int(o) for o in np.cumsum([0] + self.in_ndims)]
        self.strides = [int(np.prod(self.out_grid[i + 1:], dtype=np.int64)) for i in range(len(self.out_grid))]
        name = type(op).__name__
        reason, self.k = None, None
        if mode in ("auto", "traced"):
            try:
                self.k = _entries_traced(op, len(out_grid), in_ndims)
                if mode == "auto" and self.k > MAX_SELECT:
                    reason, self.k = f"it lists {self.k} entries (> {MAX_SELECT})", None
            except IndexMapNotTraceable as e:
                if mode == "traced":
                    raise ValueError(f"{name}.index_map cannot be traced on int32 grid indices ({e}); write "
                                     "it with arithmetic, jnp.clip or %, or use index_map='table'") from e
                reason = str(e)
        self.tabulated = self.k is None
        if self.tabulated:
            try:
                self.table, self.count, self.k = _tabulate(op, out_grid, in_ndims, self.out_offset,
                                                           self.in_offsets)
            except Exception as e:
                raise ValueError(f"{name}.index_map can neither be traced ({reason}) nor tabulated on the "
                                 f"host ({type(e).__name__}: {e})") from e
            if platform == "gpu":
                raise NotImplementedError(
                    f"window_call({name}): index_map is tabulated ({reason}), which needs scalar prefetch; "
                    "Triton has none. Run it through the executor (PallasBackend.output_tile) instead")

    def prefetch_operands(self):
        return [jnp.asarray(self.table.reshape(-1)), jnp.asarray(self.count)] if self.tabulated else []

    def _linear(self, out_idx):
        return sum((g * s for g, s in zip(out_idx, self.strides)), jnp.int32(0))

    def block(self, p, gids, prefetch):
        """Block index of input ``p`` at grid point ``gids``."""
        out_idx, k = tuple(gids[:-1]), gids[-1]
        if self.tabulated:
            base = (self._linear(out_idx) * self.k + k) * self.offsets[-1] + self.offsets[p]
            return tuple(prefetch[0][base + d] for d in range(self.in_ndims[p]))
        out_idx = tuple(g + o for g, o in zip(out_idx, self.out_offset))
        entries = _normalize_entries(self.op, self.op.index_map(out_idx), self.in_ndims)
        if self.k == 1:
            idx = entries[0][p]
        else:
            idx = tuple(lax.select_n(k, *[e[p][d] for e in entries]) for d in range(self.in_ndims[p]))
        return tuple(i - o for i, o in zip(idx, self.in_offsets[p]))

    def valid(self, gids, prefetch):
        """Whether entry ``k`` exists for this output tile (always, unless tabulated with fewer)."""
        if not self.tabulated:
            return jnp.bool_(True)
        return gids[-1] < prefetch[1][self._linear(gids[:-1])]


def _zero_outside(v, idx, shape, block):
    """Zero the part of a ragged edge block that lies past the array (read as garbage or NaN)."""
    mask = None
    for d, (size, b) in enumerate(zip(shape, block)):
        if size % b:
            m = idx[d] * b + lax.broadcasted_iota(jnp.int32, v.shape, d) < size
            mask = m if mask is None else mask & m
    return v if mask is None else jnp.where(mask, v, jnp.zeros((), v.dtype))


def window_call(op, *arrays, tile=None, block_shapes=None, out_block=None,
                interpret=None, index_map="auto", out_shape=None, out_offset=None, in_offsets=None):
    """Run ``op`` over whole in-memory arrays as one ``pallas_call`` with grid ``(*out_grid, K)``.

    Parameters
    ----------
    op : BlockParallelOp
        Built for the same tiling (e.g. ``Cls.from_inputs(TiledInput(...))``).
    *arrays : arrays or scalars
        The op's inputs, whole; 0-d inputs are scalar operands.
    tile : int, optional
        Block edge, as the executor tiles: each dim's block is ``min(tile, dim)``.
    block_shapes, out_block : optional
        Explicit block shapes per (non-scalar) input and for the output instead of ``tile``.
    interpret : bool, optional
        Default: interpret exactly when the jask backend is ``pallas-interpret``.
    index_map : ``"auto"``, ``"traced"`` or ``"table"``
        ``auto`` traces ``op.index_map`` and falls back to host tables when it
        cannot be traced or lists more than MAX_SELECT entries.
    out_shape, out_offset, in_offsets : optional
        For a window cut out of larger arrays at block boundaries: the window's
        output shape, the block index of its first output tile in the op's
        grid, and per input the block index of the window array's first block.
        Default: the arrays are whole.

    Returns the output (a scalar output comes back 0-d), in ``op.output_dtype``.
    """
    from jask.config import config
    name = type(op).__name__
    if interpret is None:
        interpret = config.backend == "pallas-interpret"   # ``auto`` never picks interpret mode
    platform = "interpret" if interpret else PallasBackend(False).platform()
    arrays = [jnp.asarray(a) for a in arrays]
    scalars = [a.ndim == 0 for a in arrays]
    shapes = [a.shape for a in arrays]
    if out_shape is None:
        out_shape = op.output_shape(*shapes)
    out_shape = tuple(int(d) for d in out_shape)
    out_dtype = jnp.dtype(op.output_dtype(*[a.dtype for a in arrays]))
    if block_shapes is None:
        if tile is None:
            raise ValueError(f"window_call({name}): give tile= or block_shapes=")
        block_shapes = [tuple(min(tile, d) for d in s) for s in shapes]
        out_block = tuple(min(tile, d) for d in out_shape)
    else:
        it = iter(block_shapes)
        block_shapes = [() if s else tuple(next(it)) for s in scalars]
        out_block = tuple(out_block) if out_block is not None else out_shape
    if platform in ("tpu", "gpu"):
        for a, b, s in zip(arrays, block_shapes, scalars):
            if not s:
                check_block_shape(name, a.shape, b, a.dtype, platform)
        if out_shape:
            check_block_shape(name, out_shape, out_block, out_dtype, platform)
    out_grid = tuple(math.ceil(d / b) for d, b in zip(out_shape, out_block))
    where = WindowIndex(op, out_grid, [len(s) for s in shapes], index_map, platform, out_offset, in_offsets)
    if platform == "gpu" and where.k > 1:
        raise NotImplementedError(
            f"window_call({name}): {where.k} entries per output tile would fold along a grid axis, "
            "but GPU grid programs run in parallel; run it through the executor (PallasBackend.output_tile)")

    grid = (*out_grid, where.k)
    n_pre = 2 if where.tabulated else 0
    ragged = [not s and any(d % b for d, b in zip(shape, blk))
              for s, shape, blk in zip(scalars, shapes, block_shapes)]
    part = jax.eval_shape(op.forward_block, *[jax.ShapeDtypeStruct(b, a.dtype) for a, b in zip(arrays, block_shapes)])
    acc_dtype = accumulator_dtype(part.dtype)
    out_tile = out_block or (1, 1)  # a scalar output is one (1, 1) tile

    def kernel(*refs):
        prefetch, in_refs, o_ref = refs[:n_pre], refs[n_pre:-1], refs[-1]
        gids = tuple(pl.program_id(i) for i in range(len(grid)))
        k, valid = gids[-1], where.valid(gids, prefetch)
        vals = []
        for p, r in enumerate(in_refs):
            v = r[0] if scalars[p] else r[...]
            if ragged[p]:
                v = _zero_outside(v, where.block(p, gids, prefetch), shapes[p], block_shapes[p])
            vals.append(v)
        part = _as_acc(op.forward_block(*vals), acc_dtype, out_tile)

        @pl.when(jnp.logical_and(k == 0, valid))
        def _init():
            o_ref[...] = part

        @pl.when(jnp.logical_and(k > 0, valid))
        def _fold():
            o_ref[...] = _as_acc(op.combine(o_ref[...], part), acc_dtype, out_tile)

        @pl.when(jnp.logical_and(k == 0, jnp.logical_not(valid)))
        def _empty():  # an output tile with no entries at all
            o_ref[...] = jnp.zeros(out_tile, acc_dtype)

    in_specs = [_smem_spec() if s else
                pl.BlockSpec(blk, lambda *g, p=p: where.block(p, g[:len(grid)], g[len(grid):]))
                for p, (s, blk) in enumerate(zip(scalars, block_shapes))]
    out_specs = pl.BlockSpec(out_tile, lambda *g: tuple(g[:len(out_grid)]) if out_shape else (0, 0))
    specs = dict(grid=grid, in_specs=in_specs, out_specs=out_specs)
    if where.tabulated:
        specs = dict(grid_spec=_tpu().PrefetchScalarGridSpec(num_scalar_prefetch=n_pre, **specs))
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape or (1, 1), acc_dtype),
        compiler_params=_compiler_params(platform, ["parallel"] * len(out_grid) + ["arbitrary"]),
        interpret=interpret,
        name=f"jask_window_{name}",
        **specs,
    )
    operands = [a.reshape(1) if s else a for a, s in zip(arrays, scalars)]  # scalars live in SMEM
    out = call(*where.prefetch_operands(), *operands)
    return out.reshape(out_shape).astype(out_dtype)
