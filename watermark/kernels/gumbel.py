"""Fused Gumbel-max sampling kernels (torch references: :mod:`watermark.gumbel`, :mod:`watermark.sampler`).

* :func:`gumbel_sample` -- the batched sampler step, equal to
  ``watermark.dispatch.sample(process_logits(logits, temperature only), rows)``, in one
  launch: per-row temperature, greedy rows, the dual-key routing coin, keyed or
  ordinary-stream rows, the context state (runtime width) and the exact race, with the
  cross-block reduction done in the kernel;
* :func:`gumbel_argmax` / :func:`exponential_race` -- the CUDA paths of the same-named
  functions of :mod:`watermark.dispatch` (rows' states given).

Grid (rows, programs per row); each program races a chunk of whole tiles of its row (see
:mod:`watermark.kernels.race`) and the last program of the row to finish reduces it
(:mod:`watermark.kernels.reduction`).
The route (key A or key B) is decided from the request's stream before the vocabulary
pass, so only the routed key's PRF words are computed: a dual-key row costs what a
single-key row costs, one pass over the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from watermark import stream
from watermark.processing import MIN_TEMPERATURE
from watermark.kernels import geometry, launch, philox, race, reduction, tiles
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN, SampleResult

LANE_ROUTE = tl.constexpr(stream.LANE_ROUTE)
R_GREEDY = tl.constexpr(ROUTE_GREEDY)
R_PLAIN = tl.constexpr(ROUTE_PLAIN)
R_KEY_A = tl.constexpr(ROUTE_KEY_A)
R_KEY_B = tl.constexpr(ROUTE_KEY_B)
MIN_T = tl.constexpr(MIN_TEMPERATURE)

# Sizes, strides, counts and per-row tensors never select a compiled variant: only the
# logits' dtype, the row-stride alignment (STRIDE_MULT) and the tile shape do.
_SIZE_ARGS = ["stride_row", "vocab", "ctx_stride", "lane", "tiles_per_block", "nblk"]
_ROW_PTRS = ["temp_ptr", "key_a_ptr", "key_b_ptr", "alpha_ptr", "ctx_ptr", "width_ptr", "wm_ptr", "skey_ptr",
             "pos_ptr", "keys_ptr", "states_ptr", "tokens_ptr", "routes_ptr", "part_s_ptr", "part_i_ptr",
             "count_ptr", "scratch_ptr"]


def _no_spec(fn_args: list[str]) -> list[str]:
    return [a for a in _SIZE_ARGS + _ROW_PTRS if a in fn_args]


_SAMPLE_ARGS = ["logits_ptr", "stride_row", "vocab", "temp_ptr", "key_a_ptr", "key_b_ptr", "alpha_ptr", "ctx_ptr",
                "ctx_stride", "width_ptr", "wm_ptr", "skey_ptr", "pos_ptr", "lane", "tokens_ptr", "routes_ptr",
                "part_s_ptr", "part_i_ptr", "count_ptr", "scratch_ptr", "tiles_per_block", "nblk"]


@triton.jit(do_not_specialize=_no_spec(_SAMPLE_ARGS))
def _gumbel_sample_kernel(logits_ptr, stride_row, vocab, temp_ptr, key_a_ptr, key_b_ptr, alpha_ptr, ctx_ptr,
                          ctx_stride, width_ptr, wm_ptr, skey_ptr, pos_ptr, lane, tokens_ptr, routes_ptr,
                          part_s_ptr, part_i_ptr, count_ptr, scratch_ptr, tiles_per_block, nblk,
                          BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr, NB: tl.constexpr,
                          COMPACT: tl.constexpr):
    row, blk, row_ptr, tile_begin, tile_end, x0, x1, x2, x3, scratch = tiles.chunk_start(
        logits_ptr, stride_row, vocab, scratch_ptr, tiles_per_block, nblk, BLOCK, STRIDE_MULT)

    temperature = tl.load(temp_ptr + row)
    greedy = temperature == 0.0
    # process_logits raises non-zero temperatures below MIN_TEMPERATURE to it (a clamp: exact).
    temperature = tl.where(greedy, temperature, tl.maximum(temperature, MIN_T))
    marked = tl.load(wm_ptr + row) != 0
    alpha = tl.load(alpha_ptr + row)
    sk0, sk1 = philox.split_key(tl.load(skey_ptr + row))
    position = tl.load(pos_ptr + row)

    # Dual-key routing from the request's stream (coin in (0, 1): alpha <= 0 is key A).
    use_b = tl.full([], 0, tl.int1)
    if marked & (alpha > 0.0):
        r0, r1, r2, r3 = philox.stream_state(sk0, sk1, position, LANE_ROUTE)
        coin = philox.uniform(philox.token_word(tl.full([], 0, tl.int32), r0, r1, r2, r3, sk0, sk1))
        use_b = coin < alpha
    route = tl.where(use_b, R_KEY_B, R_KEY_A)
    route = tl.where(marked, route, R_PLAIN)
    route = tl.where(greedy, R_GREEDY, route)

    if greedy:
        best_s, best_i = race.argmax_chunk_from(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, BLOCK)
    else:
        if marked:
            key = tl.where(use_b, tl.load(key_b_ptr + row), tl.load(key_a_ptr + row))
            k0, k1 = philox.split_key(key)
            s0, s1, s2, s3 = philox.context_state(ctx_ptr + row.to(tl.int64) * ctx_stride,
                                                  tl.load(width_ptr + row), k0, k1)
        else:
            k0 = sk0
            k1 = sk1
            s0, s1, s2, s3 = philox.stream_state(sk0, sk1, position, lane)
        best_s, best_i = race.log_race_chunk(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, temperature,
                                             temperature != 1.0, s0, s1, s2, s3, k0, k1, scratch, BLOCK, COMPACT)

    last, score, token = reduction.combine_blocks(part_s_ptr, part_i_ptr, count_ptr, row, blk, nblk, best_s, best_i, NB)
    if last:
        # No finite score anywhere (every logit -inf or NaN): token 0, as torch.argmax gives.
        token = tl.where(score == tiles.NEG_INF, 0, token)
        tl.store(tokens_ptr + row, token.to(tl.int64))
        tl.store(routes_ptr + row, route.to(tl.int8))


_STATES_ARGS = ["logits_ptr", "stride_row", "vocab", "keys_ptr", "states_ptr", "tokens_ptr", "part_s_ptr",
                "part_i_ptr", "count_ptr", "scratch_ptr", "tiles_per_block", "nblk"]


@triton.jit
def _row_state(keys_ptr, states_ptr, row):
    k0, k1 = philox.split_key(tl.load(keys_ptr + row))
    base = states_ptr + row.to(tl.int64) * 4
    return (tl.load(base).to(tl.uint32), tl.load(base + 1).to(tl.uint32), tl.load(base + 2).to(tl.uint32),
            tl.load(base + 3).to(tl.uint32), k0, k1)


@triton.jit(do_not_specialize=_no_spec(_STATES_ARGS))
def _gumbel_argmax_kernel(logits_ptr, stride_row, vocab, keys_ptr, states_ptr, tokens_ptr, part_s_ptr, part_i_ptr,
                          count_ptr, scratch_ptr, tiles_per_block, nblk,
                          BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr, NB: tl.constexpr,
                          COMPACT: tl.constexpr):
    row, blk, row_ptr, tile_begin, tile_end, x0, x1, x2, x3, scratch = tiles.chunk_start(
        logits_ptr, stride_row, vocab, scratch_ptr, tiles_per_block, nblk, BLOCK, STRIDE_MULT)
    s0, s1, s2, s3, k0, k1 = _row_state(keys_ptr, states_ptr, row)
    best_s, best_i = race.log_race_chunk(row_ptr, x0, x1, x2, x3, tile_begin, tile_end, vocab, 1.0, False,
                                         s0, s1, s2, s3, k0, k1, scratch, BLOCK, COMPACT)
    last, score, token = reduction.combine_blocks(part_s_ptr, part_i_ptr, count_ptr, row, blk, nblk, best_s, best_i, NB)
    if last:
        token = tl.where(score == tiles.NEG_INF, 0, token)
        tl.store(tokens_ptr + row, token.to(tl.int64))


@triton.jit(do_not_specialize=_no_spec(_STATES_ARGS))
def _exponential_race_kernel(logits_ptr, stride_row, vocab, keys_ptr, states_ptr, tokens_ptr, part_s_ptr,
                             part_i_ptr, count_ptr, scratch_ptr, tiles_per_block, nblk,
                             BLOCK: tl.constexpr, STRIDE_MULT: tl.constexpr, NB: tl.constexpr,
                             COMPACT: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * (stride_row * STRIDE_MULT)
    tile_begin = blk * tiles_per_block
    tile_end = tl.minimum(tile_begin + tiles_per_block, tl.cdiv(vocab, BLOCK))
    s0, s1, s2, s3, k0, k1 = _row_state(keys_ptr, states_ptr, row)
    best_s, best_i = race.ratio_race_chunk(row_ptr, tile_begin, tile_end, vocab, s0, s1, s2, s3, k0, k1, BLOCK)
    last, score, token = reduction.combine_blocks(part_s_ptr, part_i_ptr, count_ptr, row, blk, nblk, best_s, best_i, NB)
    if last:
        tl.store(tokens_ptr + row, token.to(tl.int64))


# --------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shape of the vocabulary pass (compile-time) and how rows are split (run time)."""

    block: int = 2048
    """Tokens per tile (a multiple of 4: one Philox call gives four tokens' words)."""
    num_warps: int = 4
    programs_per_sm: int = 4
    """Target programs resident per multiprocessor; sets programs per row for small batches."""
    reduce_block: int = 64
    """Partials read per step by the program that reduces a row."""
    compact: bool = True
    """Race only the tokens that can still win once a tile is sparse in them (Zipf-like
    rows, top-k masks): they are queued with their logits and raced BLOCK / 4 at a time
    (race.queue_append / queue_drain); False keeps every tile dense (the fallback)."""
    maxnreg: int | None = None
    """Register cap per thread (Triton's ``maxnreg``), None: the compiler's choice."""

    def launch_options(self) -> dict:
        options = {"num_warps": self.num_warps}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        return options


# 128 registers: four programs of 4 warps per multiprocessor; ptxas fits every variant
# (fp32/bf16/fp16, aligned or not) without spilling (140 uncapped for fp32).
DEFAULT_CONFIG = LaunchConfig(maxnreg=128, compact=False)
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every launch configuration the dispatchers (watermark.sampler, watermark.gumbel and the
# engines, which pass no config) can select; the warm-up registry enumerates these.
DISPATCH_CONFIGS = (DEFAULT_CONFIG,)
STRIDE_MULTS = (16, 1)


def compile_time_args(config: LaunchConfig, mult: int) -> tuple[dict, dict]:
    """(compile-time constants, launch options) of a vocabulary-kernel launch."""
    return (dict(BLOCK=config.block, STRIDE_MULT=mult, NB=config.reduce_block, COMPACT=config.compact),
            config.launch_options())


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if its first element is 16-byte aligned, else an aligned copy: pointer
    alignment never selects a compiled variant (views that start mid-row are rare)."""
    if x.numel() and x.data_ptr() % 16:
        return x.clone(memory_format=torch.contiguous_format)
    return x


def _vocab_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """[B, V] rows with unit column stride in a supported dtype (copies only if needed)."""
    if x.dim() != 2:
        raise ValueError(f"{name} must be [B, V]; got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        x = x.to(torch.float32)
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return aligned_rows(x)


def stride_mult(x: torch.Tensor) -> int:
    """16 when every row starts 16 elements apart (vector loads), else 1."""
    return 16 if x.stride(0) % 16 == 0 else 1


def _row_tensor(x, batch: int, dtype: torch.dtype, device: torch.device, name: str) -> torch.Tensor:
    x = torch.as_tensor(x, device=device)
    if x.shape != (batch,):
        raise ValueError(f"{name} must have shape [{batch}]; got {tuple(x.shape)}")
    return x.to(dtype).contiguous()


def flags_int8(x, shape: tuple, device: torch.device, name: str) -> torch.Tensor:
    """Booleans as int8 (a bool tensor is reinterpreted, not copied): one pointer type, so
    the caller's choice of bool or integer flags never selects another compiled variant."""
    x = torch.as_tensor(x, device=device)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}; got {tuple(x.shape)}")
    x = x.contiguous()
    return x.view(torch.int8) if x.dtype == torch.bool else (x != 0).to(torch.int8)


def _launch_race(kernel, name: str, values: torch.Tensor, keys: torch.Tensor, states: torch.Tensor,
                 config: LaunchConfig, blocks_per_row: int | None) -> torch.Tensor:
    batch, vocab = values.shape
    device = values.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return tokens
    if vocab == 0:
        raise ValueError("the vocabulary must hold at least one token")
    keys = _row_tensor(keys, batch, torch.int64, device, "keys")
    states = torch.as_tensor(states, device=device).to(torch.int64).contiguous()
    if states.shape != (batch, 4):
        raise ValueError(f"states must be [{batch}, 4]; got {tuple(states.shape)}")
    per_block, nblk = geometry.split_rows(batch, vocab, config.block, device, config.programs_per_sm, blocks_per_row)
    ws = reduction.workspace(device, batch, batch * nblk, batch * nblk * 2 * config.block)
    mult = stride_mult(values)
    constexprs, options = compile_time_args(config, mult)
    launch.launch(kernel, name, (batch, nblk),
                  (values, values.stride(0) // mult, vocab, keys, states, tokens, ws.scores, ws.tokens, ws.counters,
                   ws.scratch, per_block, nblk), dtype=values.dtype, constexprs=constexprs, options=options,
                  aligned=(values,))
    return tokens


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor, *,
                  config: LaunchConfig = DEFAULT_CONFIG, blocks_per_row: int | None = None) -> torch.Tensor:
    """Same result as :func:`watermark.gumbel.gumbel_argmax_reference`: logits [B, V]
    (float32/bfloat16/float16, any row stride), keys [B] int64, states [B, 4] -> tokens [B]."""
    return _launch_race(_gumbel_argmax_kernel, "gumbel_argmax", _vocab_rows(logits, "logits"), keys, states, config,
                        blocks_per_row)


def exponential_race(weights: torch.Tensor, keys: torch.Tensor, states: torch.Tensor, *,
                     config: LaunchConfig = DEFAULT_CONFIG, blocks_per_row: int | None = None) -> torch.Tensor:
    """Same result as :func:`watermark.gumbel.exponential_race_reference` for weights >= 0
    (finite or +inf): weights [B, V], keys [B], states [B, 4] -> tokens [B]."""
    return _launch_race(_exponential_race_kernel, "exponential_race", _vocab_rows(weights, "weights"), keys, states,
                        config, blocks_per_row)


def gumbel_sample(logits: torch.Tensor, *, temperature: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor,
                  alpha: torch.Tensor, contexts: torch.Tensor, widths: torch.Tensor, watermark: torch.Tensor,
                  stream_keys: torch.Tensor, positions: torch.Tensor, lane: int = stream.LANE_SAMPLE,
                  config: LaunchConfig = DEFAULT_CONFIG, blocks_per_row: int | None = None) -> SampleResult:
    """One decode step for a batch of rows, in one launch.

    logits [B, V] (float32/bfloat16/float16, any row stride; top-k/top-p already applied
    as -inf), temperature [B] (0: greedy), key_a/key_b/stream_keys [B] int64 bit patterns,
    alpha [B] float32 (probability of key B; 0 for single-key rows), contexts [B, C] int64
    (each row's watermark context in its first ``widths[b]`` entries, 1 <= widths <= C),
    watermark [B] bool (False: the ordinary stream), positions [B] int64; ``lane``: the
    stream lane of unwatermarked rows (LANE_DRAFT for speculative drafts).

    Returns the same tokens and routes as
    ``dispatch.sample(process_logits(logits, ProcessingParams(temperature, 0, 1)), rows, lane=lane)``.
    """
    values = _vocab_rows(logits, "logits")
    batch, vocab = values.shape
    device = values.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    routes = torch.empty(batch, dtype=torch.int8, device=device)
    if batch == 0:
        return SampleResult(tokens=tokens, routes=routes)
    if vocab == 0:
        raise ValueError("the vocabulary must hold at least one token")
    contexts = torch.as_tensor(contexts, device=device).to(torch.int64)
    if contexts.dim() != 2 or contexts.shape[0] != batch or contexts.shape[1] < 1:
        raise ValueError(f"contexts must be [{batch}, C] (padded to the widest context)")
    if contexts.stride(1) != 1:
        contexts = contexts.contiguous()
    widths = _row_tensor(widths, batch, torch.int32, device, "widths")
    per_block, nblk = geometry.split_rows(batch, vocab, config.block, device, config.programs_per_sm, blocks_per_row)
    ws = reduction.workspace(device, batch, batch * nblk, batch * nblk * 2 * config.block)
    mult = stride_mult(values)
    constexprs, options = compile_time_args(config, mult)
    launch.launch(_gumbel_sample_kernel, "gumbel_sample", (batch, nblk), (
        values, values.stride(0) // mult, vocab,
        _row_tensor(temperature, batch, torch.float32, device, "temperature"),
        _row_tensor(key_a, batch, torch.int64, device, "key_a"),
        _row_tensor(key_b, batch, torch.int64, device, "key_b"),
        _row_tensor(alpha, batch, torch.float32, device, "alpha"),
        contexts, contexts.stride(0), widths,
        flags_int8(watermark, (batch,), device, "watermark"),
        _row_tensor(stream_keys, batch, torch.int64, device, "stream_keys"),
        _row_tensor(positions, batch, torch.int64, device, "positions"), lane,
        tokens, routes, ws.scores, ws.tokens, ws.counters, ws.scratch, per_block, nblk),
        dtype=values.dtype, constexprs=constexprs, options=options, aligned=(values,))
    return SampleResult(tokens=tokens, routes=routes)


class PreparedSample:
    """:func:`gumbel_sample` over fixed per-row tensors, for a decode loop that calls it
    step after step with new logits only (the vLLM plugin's CUDA step).

    The row tensors (temperature, keys, alpha, contexts, widths, watermark flags, stream
    keys, positions) are bound once, by reference: the caller updates them in place
    (e.g. the deduper's step writes contexts, flags and positions) and keeps them alive.
    ``self(logits)`` draws into :attr:`tokens` / :attr:`routes` (reused buffers, overwritten
    by the next call) through a bound launch (:class:`watermark.kernels.launch.Prepared`),
    with the same variant, geometry and result as ``gumbel_sample`` on the same inputs.
    The reduction workspace is the object's own, so no other caller can move it.
    """

    def __init__(self, *, temperature: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor, alpha: torch.Tensor,
                 contexts: torch.Tensor, widths: torch.Tensor, watermark: torch.Tensor, stream_keys: torch.Tensor,
                 positions: torch.Tensor, lane: int = stream.LANE_SAMPLE, config: LaunchConfig = DEFAULT_CONFIG) -> None:
        device = temperature.device
        batch = temperature.shape[0]
        self.batch, self.device, self.lane, self.config = batch, device, lane, config
        self.rows = dict(temperature=temperature, key_a=key_a, key_b=key_b, alpha=alpha, contexts=contexts,
                         widths=widths, watermark=watermark, stream_keys=stream_keys, positions=positions)
        if contexts.dim() != 2 or contexts.shape[0] != batch or contexts.shape[1] < 1 or contexts.stride(1) != 1:
            raise ValueError(f"contexts must be [{batch}, C] with unit column stride")
        checks = dict(temperature=torch.float32, key_a=torch.int64, key_b=torch.int64, alpha=torch.float32,
                      widths=torch.int32, stream_keys=torch.int64, positions=torch.int64)
        for name, dtype in checks.items():
            x = self.rows[name]
            if x.shape != (batch,) or x.dtype != dtype or not x.is_contiguous() or x.device != device:
                raise ValueError(f"{name} must be a contiguous [{batch}] {dtype} tensor on {device}")
        if contexts.dtype != torch.int64 or contexts.device != device:
            raise ValueError(f"contexts must be int64 on {device}")
        if watermark.shape != (batch,) or watermark.dtype not in (torch.bool, torch.int8) or not watermark.is_contiguous():
            raise ValueError(f"watermark must be a contiguous [{batch}] bool or int8 tensor (bound by reference)")
        self._flags = watermark.view(torch.int8)
        self.tokens = torch.empty(batch, dtype=torch.int64, device=device)
        self.routes = torch.empty(batch, dtype=torch.int8, device=device)
        self._key = None
        self._handle = None

    def _prepare(self, values: torch.Tensor) -> None:
        batch, vocab = values.shape
        config = self.config
        per_block, nblk = geometry.split_rows(batch, vocab, config.block, self.device, config.programs_per_sm)
        self._ws = reduction.Workspace(self.device).reserve(batch, batch * nblk, batch * nblk * 2 * config.block)
        mult = stride_mult(values)
        constexprs, options = compile_time_args(config, mult)
        r, ws = self.rows, self._ws
        self._handle = launch.Prepared(_gumbel_sample_kernel, "gumbel_sample", (batch, nblk), (
            values, values.stride(0) // mult, vocab, r["temperature"], r["key_a"], r["key_b"], r["alpha"],
            r["contexts"], r["contexts"].stride(0), r["widths"], self._flags, r["stream_keys"], r["positions"],
            self.lane, self.tokens, self.routes, ws.scores, ws.tokens, ws.counters, ws.scratch, per_block, nblk),
            dtype=values.dtype, constexprs=constexprs, options=options, aligned=(0,))
        self._key = (values.dtype, tuple(values.shape), values.stride(0))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Draw every row of ``logits`` [batch, V]; returns :attr:`tokens`."""
        if (logits.dim() != 2 or logits.shape[0] != self.batch or logits.shape[1] == 0
                or logits.dtype not in SUPPORTED_DTYPES or (logits.shape[1] > 1 and logits.stride(1) != 1)
                or logits.data_ptr() % 16 or logits.device != self.device):
            result = gumbel_sample(logits, **self.rows, lane=self.lane, config=self.config)
            self.tokens.copy_(result.tokens)
            self.routes.copy_(result.routes)
            return self.tokens
        if self._key != (logits.dtype, tuple(logits.shape), logits.stride(0)):
            self._prepare(logits)
        else:
            self._handle({0: logits})
            return self.tokens
        self._handle()
        return self.tokens
