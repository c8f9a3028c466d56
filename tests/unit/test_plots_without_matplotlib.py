"""Without matplotlib the charts are skipped with one warning. Kept apart from tests/unit/test_plots.py, which
needs matplotlib, so that it runs whether matplotlib is installed or not."""

from __future__ import annotations

import logging
import sys

import numpy as np

from yolov5_smddp import plots
from yolov5_smddp.plots import write_labels_plot, write_results_plot


def test_without_matplotlib_charts_are_skipped_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.delitem(sys.modules, "yolov5_smddp.plots.render", raising=False)
    monkeypatch.delattr(plots, "render", raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    plots._render.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert write_results_plot(tmp_path, [{"epoch": 1, "box_loss": 0.1}]) is False
            assert write_labels_plot(tmp_path, [np.zeros((0, 5))], ["a"]) is False
        assert caplog.text.count("charts skipped, matplotlib cannot be imported") == 1
        assert list(tmp_path.iterdir()) == []
    finally:
        plots._render.cache_clear()
