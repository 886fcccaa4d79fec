"""``python -m fedpipe.exps``: DVC's experiment rows as one table within 120 columns (the
end-to-end run in test_pipeline.py runs it on a real repository)."""

import subprocess
import sys

import pytest

from fedpipe.exps import table

ROWS = [
    {"Experiment": None, "rev": "workspace", "dataset.name": "digits", "partition.scheme": "shards",
     "partition.alpha": "None", "fl.rounds": 30, "fedavg.test_accuracy": 0.78889,
     "fedprox.test_accuracy": 0.8,
     "fedavg.0.test_accuracy": 0.1, "classification.fedavg.test_accuracy": 0.2,
     "summary.held": 3.0, "summary.claims": 17.0},
    {"Experiment": "woozy-rubs", "rev": "abc1234", "dataset.name": "digits",
     "partition.scheme": "dirichlet", "partition.alpha": 0.05, "fl.rounds": 30,
     "fedavg.test_accuracy": 0.5, "scaffold.test_accuracy": 0.71234},
]


def test_one_row_per_experiment_and_one_column_per_method():
    lines = table(ROWS).splitlines()
    assert lines[0].split() == ["experiment", "dataset", "partition", "alpha", "rounds", "fedavg",
                                "fedprox", "scaffold", "held"]  # per-replicate keys are not methods
    assert lines[1].split() == ["workspace", "digits", "shards", "-", "30", "0.7889", "0.8000", "-",
                                "3/17"]
    assert lines[2].split() == ["woozy-rubs", "digits", "dirichlet", "0.0500", "30", "0.5000", "-",
                                "0.7123", "-"]


@pytest.mark.parametrize("methods", [4, 10])
def test_the_default_study_and_a_smokes_ten_methods_fit_120_columns(methods):
    names = ["fedavg", "fedprox", "scaffold", "feddyn", "feddc", "fedptr", "fedptr_s",
             "fedptr_s_once", "fedptr_fixed", "fedptr_noproj"]
    row = {"Experiment": "a-long-experiment-name", "dataset.name": "digits",
           "partition.scheme": "dirichlet", "partition.alpha": 0.01, "fl.rounds": 100,
           "summary.held": 12, "summary.claims": 15,
           **{f"{m}.test_accuracy": 0.9 for m in names[:methods]}}
    lines = table([row, {**row, "Experiment": "main"}, {**row, "Experiment": "workspace"}]).splitlines()
    assert max(len(line) for line in lines) <= 120
    if methods == 4:  # a row per experiment
        assert [line.split()[0] for line in lines] == ["experiment", "a-long-experiment-name", "main",
                                                       "workspace"]
    else:  # too wide so: a column per experiment, a row per method
        assert lines[0].split() == ["experiment", "a-long-experiment-name", "main", "workspace"]
        assert [line.split()[0] for line in lines[5:15]] == sorted(names)
        assert lines[-1].split() == ["held", "12/15", "12/15", "12/15"]


def test_outside_a_dvc_repository_one_line_and_a_non_zero_exit(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedpipe.exps"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: no DVC experiments to show in {tmp_path}")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_column_per_param_that_a_sweep_varies_and_none_for_shared_ones():
    """`dvc exp run -S fl.local.lr=...` twice: the table shows the lr of each experiment; params all
    rows share (the seed), and the leading columns' params, get no column of their own."""
    base = {"dataset.name": "digits", "partition.scheme": "shards", "partition.alpha": "None",
            "fl.rounds": 30, "seed": 0, "fedavg.test_accuracy": 0.7}
    rows = [{"Experiment": None, "rev": "workspace", **base, "fl.local.lr": 0.01},
            {"Experiment": "lr-hi", "rev": "a1", **base, "fl.local.lr": 0.05,
             "fedavg.test_accuracy": 0.75},
            {"Experiment": "lr-hi-r60", "rev": "a2", **base, "fl.local.lr": 0.05, "fl.rounds": 60}]
    params = {"dataset.name", "partition.scheme", "partition.alpha", "fl.rounds", "seed",
              "fl.local.lr"}
    lines = table(rows, params=params).splitlines()
    assert lines[0].split() == ["experiment", "dataset", "partition", "alpha", "rounds",
                                "fl.local.lr", "fedavg", "held"]
    assert [line.split()[5] for line in lines[1:]] == ["0.0100", "0.0500", "0.0500"]
    assert table(rows) == table(rows, params=())  # without params: the columns as before
    assert "fl.local.lr" not in table(rows)


def test_the_param_keys_are_params_yamls_as_dvc_names_them(tmp_path, monkeypatch):
    from fedpipe.exps import param_keys

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("seed: 0\nfl: {local: {lr: 0.01}, rounds: 3}\n")
    rows = [{"Experiment": "a", "seed": 0, "params.yaml:fl.rounds": 3, "fl.local.lr": 0.01,
             "fl.rounds": 0.5}]  # fl.rounds: a metric of the same name
    assert param_keys(rows) == {"seed", "params.yaml:fl.rounds", "fl.local.lr"}
