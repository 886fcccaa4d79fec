"""The papers' evaluation metrics (``fedpipe.metrics.papers.PAPERS``): each module's protocol, its
numbers on hand-made runs (constant classifiers, so every accuracy is a count), the comparison
table's columns in the papers' order, and the example of docs/extending.md section 6."""

from __future__ import annotations

import math
import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedpipe.config.fl import PAPER_KEYS
from fedpipe.data.datasets import Split
from fedpipe.metrics.papers import PAPERS
from fedpipe.metrics.runs import RunModels
from fedpipe.tasks import ClassificationTask

REPO = Path(__file__).resolve().parents[1]


def constant(cls: int) -> nn.Module:
    """A classifier of 1-feature inputs that always predicts ``cls`` (of 2 classes)."""
    m = nn.Linear(1, 2)
    with torch.no_grad():
        m.weight.zero_()
        m.bias.copy_(torch.tensor([1.0, 0.0] if cls == 0 else [0.0, 1.0]))
    return m.eval()


TEST = (torch.zeros(4, 1), torch.tensor([0, 0, 1, 1]))
COUNTS = np.array([[5, 0], [3, 3]])  # client 0 owns class 0 only, client 1 both, equally


def run_of(personal: list[nn.Module], generic: np.ndarray | None = None, corrupted=None,
           history=None, metrics=None) -> RunModels:
    return RunModels(ClassificationTask(), TEST, COUNTS, history or [], constant(0), personal,
                     generic, metrics or {}, corrupted)


def test_every_paper_module_has_the_protocol():
    for paper in PAPERS:
        assert paper.KEY in PAPER_KEYS, paper.__name__
        assert callable(paper.run_metrics) and callable(paper.notes), paper.__name__
        assert all(isinstance(k, str) and isinstance(h, str) for k, h in paper.COLUMNS)
        assert set(paper.UNSCALED) <= {k for k, _ in paper.COLUMNS}
        assert isinstance(paper.LEGEND, str)
    columns = [k for paper in PAPERS for k, _ in paper.COLUMNS]
    assert len(columns) == len(set(columns))  # no two papers claim one metric


def test_fednh_pm_v_and_pm_l_of_constant_models():
    from fedpipe.metrics import fednh

    # both clients' models predict class 0: client 0 (class 0 only) is right on all its weight,
    # client 1 (both classes, equally) on half of it, in both readings
    m = fednh.run_metrics(run_of([constant(0), constant(0)]))
    assert m == {"pm_v_mean": 0.75, "pm_v_client_std": 0.25, "pm_l_mean": 0.75,
                 "pm_l_client_std": 0.25}
    assert fednh.run_metrics(run_of([])) == {}  # no personal models, no PM


def test_perada_global_test_corrupted_and_trainable_share():
    from fedpipe.metrics import perada

    sets = {("a", 1): Split(torch.zeros(2, 1), torch.tensor([0, 0])),  # a: mean(1, .5) = .75
            ("a", 2): Split(torch.zeros(2, 1), torch.tensor([0, 1])),
            ("b", 1): Split(torch.zeros(4, 1), torch.tensor([1, 1, 1, 0]))}  # b: .25
    m = perada.run_metrics(run_of([constant(0), constant(1)], np.array([0.5, 0.5]), sets))
    # the global model (class 0) .5; own models: class 0 .5, class 1 (a: mean(0, .5), b: .75) .5
    assert m == {"trainable_share": 1.0, "personal_global_mean": 0.5, "corrupt_accuracy": 0.5,
                 "personal_corrupt_mean": 0.5}
    local = perada.run_metrics(run_of([constant(1)], None, sets))  # no global model: none of its
    assert set(local) == {"trainable_share", "personal_global_mean", "personal_corrupt_mean"}
    assert perada.run_metrics(run_of([])) == {"trainable_share": 1.0}


def test_equitable_sigma_acc_and_history_means():
    from fedpipe.metrics import equitable

    history = [{"round": 1.0, "test_sigma_acc_global": 0.2, "test_cd": 1.0},
               {"round": 2.0, "test_sigma_acc_global": 0.4, "test_cd": float("nan")}]
    m = equitable.run_metrics(run_of([], np.array([0.5, 1.0]), history=history,
                                     metrics={"test_accuracy": 0.75}))
    assert m["sigma_acc_global"] == pytest.approx(0.25) and m["sigma_acc_std"] == pytest.approx(0.25)
    assert m["sigma_acc_global_cma"] == pytest.approx(0.3) and m["cd_mean"] == 1.0
    assert "nmi_mean" not in m  # no clustering recorded
    assert equitable.run_metrics(run_of([constant(0)])) == {}  # Local: no global model, no history
    assert equitable.notes({"local": {}}) == [] and len(equitable.notes({"a": m})) == 1


def test_comparison_table_puts_each_papers_columns_in_the_papers_order():
    from fedpipe.pipeline.evaluate import comparison_table

    metrics = {"fedrep": {"test_accuracy": 0.8, "client_acc_mean": 0.7, "personal_acc_mean": 0.9,
                          "pm_v_mean": 0.85, "pm_l_mean": 0.86, "sigma_acc_global": 0.1,
                          "cd_mean": 1.5, "personal_global_mean": 0.6, "final_train_loss": 0.3}}
    table = comparison_table(metrics, "t")
    header = table.splitlines()[2]
    order = ["personal worst 10%", "PM(V)", "PM(L)", "σ_acc(g)", "CD", "personal Global-test",
             "train loss"]
    assert [header.index(h) for h in order] == sorted(header.index(h) for h in order)
    assert "| 1.5000 |" in table and "| 85.00 |" in table  # CD unscaled, PM(V) in %
    legend = table.split("\n\n")[2]
    assert "only); PM(V) / PM(L) are FedNH's" in legend and "models. Personal Global-test" not in legend
    assert "PerAda's Global-test" in legend and "Equitable-FL's metrics" in table


def test_the_extending_guides_metric_example_runs():
    """docs/extending.md section 6: its module, executed as written, on a hand-made run."""
    doc = (REPO / "docs" / "extending.md").read_text()
    section = doc.split("## 6. A paper's evaluation metric", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    clip = types.ModuleType("clip")
    exec(compile(code, "docs/extending.md", "exec"), clip.__dict__)  # noqa: S102
    run = run_of([], np.array([0.2, 0.9]),
                 metrics={"client_acc_best10": 0.9, "client_acc_worst10": 0.2})
    assert math.isclose(clip.run_metrics(run)["client_acc_gap"], 0.7)
    assert clip.run_metrics(run_of([constant(0)])) == {}
    assert clip.KEY in PAPER_KEYS or clip.KEY == "clip"  # the guide's section 5 adds the key
