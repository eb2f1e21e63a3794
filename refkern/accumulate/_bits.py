"""LLVM-level primitives Numba does not expose: bit casts and a true fused multiply-add.

``bits``/``from_bits`` reinterpret a binary64 as int64 and back (no conversion, no
rounding); LLVM vectorizes them. ``fma`` lowers to ``llvm.fma.f64``, whose semantics are
a single rounding of ``a * b + c`` on every target (a hardware FMA where the CPU has one,
libm's correctly rounded ``fma`` otherwise), unlike ``llvm.fmuladd``, which may be split.
"""

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["bits", "from_bits", "fma"]


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
