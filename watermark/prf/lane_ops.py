"""SHA-256's lane arithmetic as 32-bit LLVM operations, for the compiled lane passes of
:mod:`watermark.prf.hmac_compiled`.

numba widens every uint32 operation to 64 bits (its integer typing), so a lane loop written
with numpy scalars vectorises as 64-bit lanes, eight to an AVX-512 register, with most
rotations left as shift pairs. These intrinsics emit the i32 operations themselves (rotations
as shift pairs LLVM folds into rotates), so a lane loop runs sixteen lanes a register: about
twice the compressions a second (bench/results/prf-detect-cpu.json). Results are the same
bits by construction (SHA-256 is defined on 32-bit words; tests compare with hashlib).

Built on first use: nothing here imports numba at module import (:mod:`watermark.jit`).
"""

from __future__ import annotations

import functools


@functools.cache
def intrinsics() -> dict:
    """name -> numba intrinsic: ``_big0``, ``_big1``, ``_sig0``, ``_sig1`` (SHA-256's
    Σ0, Σ1, σ0, σ1), ``_ch``, ``_maj``, ``_add2``, ``_add4`` (sums mod 2^32); every
    argument and result a uint32."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    i32 = ir.IntType(32)
    u32 = types.uint32

    def rotr(builder, x, n):
        return builder.or_(builder.lshr(x, i32(n)), builder.shl(x, i32(32 - n)))

    def unary(first, second, third=None, shift=None):

        def typer(typingctx, x):
            def codegen(context, builder, signature, args):
                (value,) = args
                last = builder.lshr(value, i32(shift)) if third is None else rotr(builder, value, third)
                return builder.xor(builder.xor(rotr(builder, value, first), rotr(builder, value, second)), last)

            return u32(u32), codegen

        return intrinsic(typer)

    def _ch(typingctx, e, f, g):
        def codegen(context, builder, signature, args):
            e, f, g = args
            return builder.xor(builder.and_(e, f), builder.and_(builder.not_(e), g))

        return u32(u32, u32, u32), codegen

    def _maj(typingctx, a, b, c):
        def codegen(context, builder, signature, args):
            a, b, c = args
            return builder.xor(builder.xor(builder.and_(a, b), builder.and_(a, c)), builder.and_(b, c))

        return u32(u32, u32, u32), codegen

    def _add2(typingctx, a, b):
        def codegen(context, builder, signature, args):
            return builder.add(args[0], args[1])

        return u32(u32, u32), codegen

    def _add4(typingctx, a, b, c, d):
        def codegen(context, builder, signature, args):
            return builder.add(builder.add(args[0], args[1]), builder.add(args[2], args[3]))

        return u32(u32, u32, u32, u32), codegen

    return {"_big0": unary(2, 13, 22), "_big1": unary(6, 11, 25),
            "_sig0": unary(7, 18, shift=3), "_sig1": unary(17, 19, shift=10),
            "_ch": intrinsic(_ch), "_maj": intrinsic(_maj), "_add2": intrinsic(_add2), "_add4": intrinsic(_add4)}
