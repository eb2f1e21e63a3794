"""compare on integer results (refkern.analysis.integers): integer arithmetic judged to the bit against the exact
integers, written out by hand, wrapped to the result's format as torch wraps it."""

import pytest
import torch

import refkern as rk


def test_an_int8_sum_wraps_as_twos_complement():
    x = torch.tensor([100, 100, 100, 19], dtype=torch.int8)  # 319 = 256 + 63
    got = x.sum(dtype=torch.int8)
    assert int(got) == 63
    rep = rk.compare(got, "sum", x, dtype=torch.int8)
    assert rep.verdict == "exact" and str(rep) == "exact: all 1 elements equal the exact integer result"
    assert rk.compare(torch.tensor(64, dtype=torch.int8), "sum", x, dtype=torch.int8).verdict == "mismatch"


def test_an_integer_matmul_off_by_one_is_a_mismatch():
    a = torch.tensor([[1, 2], [3, 4]])
    b = torch.tensor([[5, 6], [7, 8]])
    assert rk.compare(torch.tensor([[19, 22], [43, 50]]), "matmul", a, b).verdict == "exact"
    rep = rk.compare(torch.tensor([[19, 22], [43, 51]]), "matmul", a, b)
    assert (rep.verdict, rep.n_diff, rep.first, rep.max_ulp) == ("mismatch", 1, 3, 1.0)


def test_integers_beyond_2_to_the_53_are_refused_by_name():
    x = torch.tensor([2**53 + 1, 1])
    with pytest.raises(ValueError, match="argument 0 of sum holds integers beyond 2\\*\\*53"):
        rk.compare(x.sum(), "sum", x)
    y = torch.tensor([2**52, 2**52])  # each exact, their sum 2**53 is not below it
    with pytest.raises(ValueError, match="beyond 2\\*\\*53 in magnitude"):
        rk.compare(y.sum(), "sum", y)
