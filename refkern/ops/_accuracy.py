"""Accuracy classes of the math libraries backends call for elementwise functions: data, read by the
yardstick (:mod:`refkern.analysis.elementwise`). Each class gives, per function, the documented largest
error in ulps of the working format (or an absolute error), and where it is documented.

Sources:

* **SLEEF** (sleef.org, "Function reference"): functions named ``_u10`` have a maximum error of 1.0 ulp,
  ``_u35`` of 3.5 ulp (measured against MPFR, the whole domain). torch's CPU vectorised kernels
  (ATen ``Vectorized<float>``/``Vectorized<double>``) call the ``_u10`` functions for exp, exp2, expm1,
  log, log2, log1p, sin, cos, tanh, erf and pow.
* **ATen's vectorised erf** of ``Vectorized<float>`` (used by gelu, and by torch.erf of bfloat16 and
  float16 inputs, which widen to float) is Abramowitz & Stegun 7.1.26, ``erf x = 1 - (a1 t + ... + a5
  t**5) e**(-x**2)``, ``t = 1 / (1 + 0.3275911 |x|)``, whose error is at most 1.5e-7 absolute (A&S,
  Handbook of Mathematical Functions, 1964, 7.1.26). Its float32 evaluation adds at most 32 roundings
  of quantities at most 1 in magnitude (t: 2; the degree-5 Horner: 10 of partial sums bounded by
  sum |a_i| t <= 4.5, i.e. 4.5 each; the products with t and the exp: 3; exp's 1 ulp; the final
  subtraction: 1), each at most ``2**-24``: charged ``1.5e-7 + 32 * 2**-24`` absolute. (Found by
  measurement: torch.erf of a bfloat16 9.4e-8 is 228 ulp off; float32 torch.erf is within 0.74 ulp.)
* **oneMKL VM** (Intel oneMKL Vector Mathematics, accuracy modes: HA, the default, within 1 ulp): ATen's
  ``vml`` sqrt calls it where torch is built with MKL; torch's CPU sqrt is not correctly rounded
  (measured: 0.74 ulp in float32, 1 ulp in float64), so the torch CPU class charges sqrt 1 ulp.
* **glibc libm** (GNU C Library manual, "Known Maximum Errors in Math Functions", x86_64 column): the
  largest errors its test suite exposes; torch's scalar (non-vectorised) paths call it.
* **CUDA** (CUDA C++ Programming Guide, appendix "Mathematical Functions", tables "Single-Precision
  Mathematical Standard Library Functions with Maximum ULP Error" and the double-precision one;
  "generated from extensive but not exhaustive tests, so they are not guaranteed bounds").
* **CUDA intrinsics** (same appendix, "Intrinsic Functions", the functions ``-use_fast_math`` maps to):
  ``__expf`` at most ``2 + floor(|1.173 x|)`` ulp; ``__logf`` 2**-21.41 absolute for x in [0.5, 2],
  else 3 ulp; ``__sinf``/``__cosf`` 2**-21.41 absolute for x in [-pi, pi]; ``tanh.approx.f32``
  (``__tanhf``) 2**-10.987 relative; ``__fdividef`` 2 ulp. These are a named reduced precision.

A value ``("abs", a)`` is an absolute error bound; a number is ulps of the working format at the exact
value (float32 for float16/bfloat16/float32 inputs, float64 for float64 ones); ``None``: correctly
rounded (IEEE 754's sqrt, division).
"""

from dataclasses import dataclass

__all__ = ["Library", "LIBRARIES", "library"]


@dataclass(frozen=True)
class Library:
    """One math library's documented accuracy: ``ulps[f]`` per function (module docstring), ``devices``
    the device types whose results it may have produced (empty: any), ``reduced``: a fast-math class
    (a named reduced precision, not rounding)."""

    name: str
    ulps: dict
    source: str
    devices: tuple = ()
    reduced: bool = False
    half: dict | None = None  # overrides for float16/bfloat16 inputs (computed in float32)


_AS_ERF = ("abs", 1.5e-7 + 32 * 2.0**-24)
_U10 = {f: 1.0 for f in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tanh", "erf", "pow")}
_MKL_SQRT = 1.0  # ATen's vml sqrt is oneMKL's vsSqrt/vdSqrt where MKL is built in: VM's HA mode, <= 1 ulp

LIBRARIES = (
    Library("torch CPU (SLEEF u10)", {**_U10, "erf_vec": _AS_ERF, "sqrt": _MKL_SQRT},
            "SLEEF function reference: _u10 = 1.0 ulp; ATen Vectorized<float>::erf = A&S 7.1.26; oneMKL VM HA sqrt",
            devices=("cpu", "numpy"), half={"erf": _AS_ERF}),
    Library("glibc libm", {"exp": 1.0, "exp2": 1.0, "expm1": 1.0, "log": 1.0, "log2": 1.0, "log1p": 1.0,
                           "sin": 1.0, "cos": 1.0, "tanh": 2.0, "erf": 1.0, "pow": 1.0, "erf_vec": 1.0},
            "GNU C Library manual, Known Maximum Errors in Math Functions (x86_64)", devices=("cpu", "numpy")),
    Library("CUDA libdevice", {"exp": 2.0, "exp2": 2.0, "expm1": 1.0, "log": 1.0, "log2": 1.0, "log1p": 1.0,
                               "sin": 2.0, "cos": 2.0, "tanh": 2.0, "erf": 2.0, "pow": 4.0, "erf_vec": 2.0,
                               "rsqrt": 2.0},
            "CUDA C++ Programming Guide, Mathematical Functions, single precision (double: 1 ulp exp/log "
            "family, 2 sin/cos/tanh/erf/pow; rsqrtf 2 ulp, rsqrt 1: torch's CUDA rsqrt calls it, seen 1.41 ulp "
            "on an H100)", devices=("cuda", "numpy")),
    Library("CUDA fast-math intrinsics", {"exp": ("expf_fast",), "exp2": 2.0, "log": ("logf_fast",),
                                          "log2": ("logf_fast",), "sin": ("sincos_fast",), "cos": ("sincos_fast",),
                                          "tanh": ("rel", 2.0**-10.987)},
            "CUDA C++ Programming Guide, Intrinsic Functions (-use_fast_math)", devices=("cuda", "numpy"),
            reduced=True),
)  # fmt: skip


def library(name: str) -> Library:
    for lib in LIBRARIES:
        if lib.name == name:
            return lib
    raise ValueError(f"accuracy: unknown library {name!r}; choose one of {', '.join(repr(x.name) for x in LIBRARIES)}.")
