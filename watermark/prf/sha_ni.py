"""SHA-256 compressions with the x86 SHA extensions (SHA-NI), for the lane passes of
:mod:`watermark.prf.hmac_compiled`.

``sha256rnds2`` does two rounds on a state held as two 128-bit halves (A, B, E, F and
C, D, G, H), ``sha256msg1`` / ``sha256msg2`` extend the message schedule four words at a
time (Intel, "Intel SHA Extensions", 2013; the instruction set reference's SHA256RNDS2,
SHA256MSG1, SHA256MSG2 pseudo-code gives the lane order used below). One compression is a
chain of 32 dependent ``rnds2``, whose latency leaves the unit idle, so one call compresses
GROUP independent messages with their instructions interleaved (on this box's EPYC: 32.9 ns a
compression one message a call, 23.1 ns four a call; eight spill registers,
bench/results/prf-detect-cpu-shani.md).

The lane passes keep SHA-256's words transposed (``st [8, LANES]``, ``w [64, LANES]``: one
row per word, one column per message); a call reads GROUP columns of rows as vectors and
transposes them into the per-message form the instructions take, and back. Same bits as the
lane arithmetic by construction (the same compression function); tests compare both with
hashlib on each path.

Keep 256-bit (ymm) values away from these instructions: they are SSE-encoded, and one 1-D
variant whose state LLVM packed into a ymm register ran a compression in ~5 us instead of
~45 ns on this box's EPYC. numba's on-disk cache keys the passes by hmac_compiled.py alone:
after editing this module, clear that cache (its ``__pycache__/*.nb[ic]``) before measuring.

Built on first use: nothing here imports numba at module import (:mod:`watermark.jit`).
"""

from __future__ import annotations

import functools

from watermark.prf import sha256

GROUP = 4
"""Messages one call compresses together (interleaved)."""


@functools.cache
def available() -> bool:
    """Whether numba's code generator targets a CPU with the SHA extensions (its host CPU's
    features, or ``NUMBA_CPU_FEATURES`` where set): decided once per process. numba keys its
    on-disk cache by the same features, so code built here never runs on a CPU without them.
    False without numba, or where its code generator does not say (the lane arithmetic then)."""
    try:
        from numba.core.registry import cpu_target
    except ImportError:  # pragma: no cover - exercised where numba is missing
        return False
    # numba's own feature string, not llvmlite's host query: NUMBA_CPU_FEATURES can narrow it,
    # and an instruction the target machine lacks fails to select at compile time.
    features = getattr(cpu_target.target_context.codegen(), "_tm_features", "")
    return "+sha" in features.split(",")


def intrinsics() -> dict:
    """name -> numba intrinsic: ``_sha_ni_lanes`` (:func:`lanes_intrinsic` of GROUP), and
    ``_sha_ni_one`` (of one column: a single message, the per-row passes)."""
    return {"_sha_ni_lanes": lanes_intrinsic(GROUP), "_sha_ni_one": lanes_intrinsic(1)}


@functools.cache
def lanes_intrinsic(group: int):
    """The numba intrinsic ``(st, w, j)`` that compresses the message in
    ``w[:16, c]`` into ``st[:, c]`` for the ``group`` columns ``c = j .. j + group - 1`` (st
    [8, L], w [>= 16, L], both uint32, C-contiguous, ``j + group <= L``); with a group of
    one, st [8] and w [>= 16] may be one message's own arrays (j is then ignored). Where the code
    generator lacks the extensions (:func:`available` is False) it compiles to raising
    RuntimeError: the passes never call it there, and the instructions could not be selected."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(i32, 4)
    row = ir.VectorType(i32, group)
    constants = [ir.Constant(vec, [ir.Constant(i32, k) for k in sha256.K[4 * q:4 * q + 4]]) for q in range(16)]

    def shuffle(builder, x, y, mask):
        return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, len(mask)), mask))

    def gather(builder, rows, column):
        """<4 x i32> of rows[0..3]'s entry ``column`` (one message's four words)."""
        out = ir.Constant(vec, ir.Undefined)
        for i, r in enumerate(rows):
            out = builder.insert_element(out, builder.extract_element(r, i32(column)), i32(i))
        return out

    def compress(builder, fns, abef, cdgh, blocks):
        """The compressions of ``group`` messages, interleaved instruction by instruction: abef,
        cdgh [group] their states, blocks [group][4] their words W0..W15 four a vector (the
        schedule's vector q holds words 4q .. 4q + 3)."""
        rnds2, msg1, msg2 = fns
        start = [(a, c) for a, c in zip(abef, cdgh)]
        sched = [list(b) for b in blocks]
        for q in range(16):
            if q >= 4:
                for s in sched:  # msg1 adds σ0 of words 4q-15.., the shuffle words 4q-7.., msg2 σ1
                    early = builder.call(msg1, [s[q - 4], s[q - 3]])
                    mid = builder.add(early, shuffle(builder, s[q - 2], s[q - 1], [1, 2, 3, 4]))
                    s.append(builder.call(msg2, [mid, s[q - 1]]))
            wk = [builder.add(s[q], constants[q]) for s in sched]
            for half in range(2):  # rounds 4q, 4q + 1 from wk's low words, then 4q + 2, 4q + 3
                if half:
                    wk = [shuffle(builder, x, x, [2, 3, 0, 1]) for x in wk]
                new = [builder.call(rnds2, [c, a, x]) for a, c, x in zip(abef, cdgh, wk)]
                cdgh, abef = abef, new
        return ([builder.add(a, s[0]) for a, s in zip(abef, start)],
                [builder.add(c, s[1]) for c, s in zip(cdgh, start)])

    def _sha_ni_lanes(typingctx, st, w, j):
        ndim = getattr(st, "ndim", None)
        if not (isinstance(st, types.Array) and isinstance(w, types.Array) and st.dtype == types.uint32
                and w.dtype == types.uint32 and w.ndim == ndim and (ndim == 2 or (ndim == 1 and group == 1))):
            return None

        def codegen(context, builder, signature, args):
            if not available():
                with builder.if_then(cgutils.true_bit):
                    context.call_conv.return_user_exc(builder, RuntimeError, ("no SHA extensions",))
                return context.get_dummy_value()
            fns = tuple(cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * arity),
                                                       f"llvm.x86.sha256{name}")
                        for name, arity in (("rnds2", 3), ("msg1", 2), ("msg2", 2)))
            st_ty, w_ty = signature.args[0], signature.args[1]
            st_ary = context.make_array(st_ty)(context, builder, args[0])
            w_ary = context.make_array(w_ty)(context, builder, args[1])
            col = context.cast(builder, args[2], signature.args[2], types.int64)

            def row_ptr(ty, ary, r):
                if ndim == 2:
                    p = cgutils.get_item_pointer(context, builder, ty, ary, [i64(r), col], wraparound=False)
                else:
                    # Addressed through the array's stride, not as contiguous words: LLVM then
                    # cannot merge the eight state words into one 256-bit value, which stays live
                    # across the SSE-encoded SHA instructions and slows them ~100x (measured).
                    (stride,) = cgutils.unpack_tuple(builder, ary.strides, 1)
                    p = builder.gep(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), [builder.mul(i64(r), stride)])
                return builder.bitcast(p, row.as_pointer())

            st_rows = [builder.load(row_ptr(st_ty, st_ary, r), align=4) for r in range(8)]
            w_rows = [builder.load(row_ptr(w_ty, w_ary, r), align=4) for r in range(16)]
            # A state as the instructions take it: ABEF = [F, E, B, A], CDGH = [H, G, D, C]
            # (element 0 first), i.e. words 5, 4, 1, 0 and 7, 6, 3, 2.
            abef = [gather(builder, [st_rows[5], st_rows[4], st_rows[1], st_rows[0]], m) for m in range(group)]
            cdgh = [gather(builder, [st_rows[7], st_rows[6], st_rows[3], st_rows[2]], m) for m in range(group)]
            blocks = [[gather(builder, w_rows[4 * q:4 * q + 4], m) for q in range(4)] for m in range(group)]
            abef, cdgh = compress(builder, fns, abef, cdgh, blocks)
            # and back: A, B are ABEF's elements 3, 2; C, D CDGH's 3, 2; E, F ABEF's 1, 0; G, H CDGH's.
            for r, (half, element) in enumerate([(0, 3), (0, 2), (1, 3), (1, 2), (0, 1), (0, 0), (1, 1), (1, 0)]):
                out = ir.Constant(row, ir.Undefined)
                for m in range(group):
                    value = builder.extract_element((abef, cdgh)[half][m], i32(element))
                    out = builder.insert_element(out, value, i32(m))
                builder.store(out, row_ptr(st_ty, st_ary, r), align=4)
            return context.get_dummy_value()

        return types.none(st, w, j), codegen

    return intrinsic(_sha_ni_lanes)
