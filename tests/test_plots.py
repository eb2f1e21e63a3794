"""The plots: exact points are marked as exact, never drawn at a made-up tiny value."""

import warnings

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from refkern.report.plots import error_plots, sweep_figure, sweep_plot  # noqa: E402


def _row(k, backend, mx, med):
    return {"k": k, "backend": backend, "max_rel_error": mx, "median_rel_error": med}


def _lines(fig):
    return {ln.get_label(): ln for ln in fig.axes[0].get_lines()}


def test_a_sweep_where_every_point_is_exact_marks_them_exact():
    import matplotlib.pyplot as plt

    rows = [_row(k, "cpu", 0.0, 0.0) for k in (16, 32, 64)]
    fig = sweep_figure(rows, "dot", "float16")
    lines = _lines(fig)
    assert "cpu: exact (error 0)" in lines and "cpu: max" not in lines and "cpu: median" not in lines
    ys = np.concatenate([np.asarray(ln.get_ydata(), float) for ln in lines.values()])
    ys = ys[np.isfinite(ys)]
    floor = lines["cpu: exact (error 0)"].get_ydata()[0]
    assert ys.min() == floor > 1e-12  # not 1e-30: just below the smallest value drawn (the bounds)
    assert floor < np.sqrt(16) * 2.0**-24
    assert any(t.get_text() == "exact: error 0" for t in fig.axes[0].texts)
    plt.close(fig)


def test_a_sweep_with_some_exact_points_breaks_the_curve_there(tmp_path):
    import matplotlib.pyplot as plt

    rows = [_row(16, "cpu", 0.0, 0.0), _row(32, "cpu", 3e-8, 1e-8), _row(64, "cpu", 4e-8, 0.0)]
    fig = sweep_figure(rows, "linear", "float32")
    lines = _lines(fig)
    mx = np.asarray(lines["cpu: max"].get_ydata(), float)
    assert np.isnan(mx[0]) and mx[1] == 3e-8
    med = np.asarray(lines["cpu: median"].get_ydata(), float)
    assert np.isnan(med[0]) and np.isnan(med[2])
    assert list(lines["cpu: exact (error 0)"].get_xdata()) == [16.0]
    assert lines["cpu: exact (error 0)"].get_ydata()[0] < 1e-8
    plt.close(fig)
    path = sweep_plot(rows, "linear", "float32", str(tmp_path / "s.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_error_plots_of_an_all_exact_output(tmp_path):
    z = np.zeros(12)
    arrays = {"error": z, "bound": np.full(12, 1e-7), "ulp": z}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no artists with labels" and no log-of-zero warnings
        error_plots(arrays, "conv2d: exact", str(tmp_path / "e.png"))
    assert (tmp_path / "e.png").stat().st_size > 10_000
