"""LLVM-level primitives Numba does not expose: bit casts and a true fused multiply-add.

``bits``/``from_bits`` reinterpret a binary64 as int64 and back (no conversion, no
rounding); LLVM vectorizes them. ``fma`` lowers to ``llvm.fma.f64``, whose semantics are
a single rounding of ``a * b + c`` on every target (a hardware FMA where the CPU has one,
libm's correctly rounded ``fma`` otherwise), unlike ``llvm.fmuladd``, which may be split.
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["bits", "from_bits", "fma", "pow2"]


@intrinsic
def bits(typingctx, x):
    """The IEEE 754 bit pattern of a float64 as an int64."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def from_bits(typingctx, i):
    """The float64 whose IEEE 754 bit pattern is the int64 ``i``."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (IEEE 754 fusedMultiplyAdd)."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def pow2(typingctx, k):
    """2.0**k built from its bits, exact for -1022 <= k <= 1023 (and +inf for k == 1024);
    ``2.0**k`` in Numba calls libm's pow, which costs tens of ns."""
    if not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        kk = context.cast(builder, args[0], signature.args[0], types.int64)
        e = builder.shl(builder.add(kk, ir.Constant(i64, 1023)), ir.Constant(i64, 52))
        return builder.bitcast(e, ir.DoubleType())

    return types.float64(k), codegen
