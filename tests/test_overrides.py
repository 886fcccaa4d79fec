"""A mistyped `dvc exp run -S key=value` gets fedpipe's one line ("did you mean ...?") while DVC
composes params.yaml, before any stage runs (hydra_plugins/fedpipe_overrides.py)."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from hydra_plugins.fedpipe_overrides import unknown_key_message  # noqa: E402

CFG = OmegaConf.create({"fl": {"rounds": 30, "local": {"lr": 0.05, "lr_decay": 1.0}},
                        "partition": {"scheme": "shards", "num_clients": 10, "shards_per_client": 2}})


@pytest.mark.parametrize("key, line", [
    ("fl.roudns", "invalid config: fl.roudns=3; allowed: a key of fl (did you mean fl.rounds?)"),
    ("fl.local.lrr", "invalid config: fl.local.lrr=3; allowed: a key of fl.local (did you mean "
                     "fl.local.lr?)"),
    ("partitoin", "invalid config: partitoin=3; allowed: a top-level section (did you mean "
                  "partition?)"),
    ("partition.alpha", "invalid config: partition.alpha=3; allowed: a key of partition: "
                        "num_clients, scheme, shards_per_client (this scheme is shards; another "
                        "scheme's keys come with it: -S partition=<scheme>)"),
])
def test_an_unknown_key_gets_one_line_with_the_closest_keys(key, line):
    assert unknown_key_message(CFG, key, "3") == line


def test_a_known_key_passes():
    assert unknown_key_message(CFG, "fl.rounds", "3") is None
    assert unknown_key_message(CFG, "fl.local.lr", "0.1") is None


def test_dvcs_composition_stops_on_the_typo_with_fedpipes_line(repo_root, tmp_path):
    """As `dvc exp run -S` composes: DVC's compose_and_dump with the repo root as plugins path, in a
    fresh process (Hydra loads its plugins once per process)."""
    code = ("import sys; from dvc.utils.hydra import compose_and_dump\n"
            "try:\n"
            f"    compose_and_dump({str(tmp_path / 'p.yaml')!r}, {str(repo_root / 'conf')!r}, None, "
            f"'config', {str(repo_root)!r}, sys.argv[1:])\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e); sys.exit(3)\n")
    bad = subprocess.run([sys.executable, "-c", code, "fl.roudns=3"], capture_output=True, text=True)
    assert bad.returncode == 3, bad.stderr
    assert bad.stdout.strip() == ("UnknownKeyError invalid config: fl.roudns=3; allowed: a key of fl "
                                  "(did you mean fl.rounds?)")
    assert not (tmp_path / "p.yaml").exists() or "roudns" not in (tmp_path / "p.yaml").read_text()
    ok = subprocess.run([sys.executable, "-c", code, "fl.rounds=3", "+fl.extra=1"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # `+key=value` keeps its Hydra meaning


def test_dvcs_composition_loads_the_filter_of_the_no_hash_info_warning(repo_root, tmp_path):
    """After DVC's compose_and_dump (as `dvc exp run -S` runs it, before its checkout), dvc-data's
    checkout warning about an output that dvc.lock does not list yet is dropped (its exact call, from
    dvc_data/index/checkout.py); another warning of the same logger, and of DVC, still shows."""
    setup = ("import logging, sys\n"
             "logging.basicConfig(stream=sys.stdout, format='%(levelname)s: %(message)s')\n")
    compose = ("from dvc.utils.hydra import compose_and_dump\n"
               f"compose_and_dump({str(tmp_path / 'p.yaml')!r}, {str(repo_root / 'conf')!r}, None, "
               f"'config', {str(repo_root)!r}, ['fl.rounds=3'])\n")
    emit = ("for name in ('dvc_data.index.checkout', 'dvc_data.hashfile.checkout'):\n"
            "    log = logging.getLogger(name)\n"
            "    log.warning(\"No file hash info found for '%s'. It won't be created.\", 'data/x')\n"
            "    log.warning('Some other warning %s', name)\n"
            "logging.getLogger('dvc').warning(\"No file hash info found for 'y' (not dvc-data's)\")\n")
    proc = subprocess.run([sys.executable, "-c", setup + compose + emit], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "WARNING: Some other warning dvc_data.index.checkout",
        "WARNING: Some other warning dvc_data.hashfile.checkout",
        "WARNING: No file hash info found for 'y' (not dvc-data's)"]
    # in a process that composes nothing (no plugins loaded) the same call shows
    plain = subprocess.run([sys.executable, "-c", setup + emit], capture_output=True, text=True)
    assert "WARNING: No file hash info found for 'data/x'. It won't be created." in plain.stdout


def compose(repo_root, tmp_path, *overrides: str) -> dict:
    """params.yaml as `dvc exp run -S ...` composes it (a fresh process: Hydra loads plugins once)."""
    import yaml

    out = tmp_path / "p.yaml"
    code = ("import sys; from dvc.utils.hydra import compose_and_dump\n"
            f"compose_and_dump({str(out)!r}, {str(repo_root / 'conf')!r}, None, 'config', "
            f"{str(repo_root)!r}, sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-c", code, *overrides], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return yaml.safe_load(out.read_text())


def test_params_carry_the_study_methods_only_each_with_what_the_study_changes(repo_root, tmp_path):
    """A method's defaults are its dataclass's: the composed algorithms section holds one entry per
    method of the study ({} when the study changes nothing), and any registered method can be set
    with -S algorithms.<name>.<key> (no +), also one the study adds on the same command line."""
    from fedpipe.algorithms import ALGORITHMS

    p = compose(repo_root, tmp_path)
    study = p["study"]
    assert set(p["algorithms"]) == set(study["algorithms"] + study["diffusion_algorithms"])
    assert p["algorithms"]["fedavg"] == {}  # nothing restated from FedAvgConfig
    assert p["algorithms"]["fedddpm"] == {"server_lr": 2.5e-4, "server_batch_size": 32}
    p = compose(repo_root, tmp_path, "study.algorithms=[fedavg,fednh]", "study.diffusion_algorithms=[]",
                "algorithms.fednh.rho=0.5")
    assert p["algorithms"] == {"fedavg": {}, "fednh": {"rho": 0.5}}
    assert "fednh" in ALGORITHMS and "rho" in {
        f.name for f in __import__("dataclasses").fields(ALGORITHMS["fednh"].config_class)}


def test_a_misspelt_method_field_gets_the_methods_own_fields(repo_root, tmp_path):
    code = ("import sys; from dvc.utils.hydra import compose_and_dump\n"
            "try:\n"
            f"    compose_and_dump({str(tmp_path / 'p.yaml')!r}, {str(repo_root / 'conf')!r}, None, "
            f"'config', {str(repo_root)!r}, sys.argv[1:])\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e); sys.exit(3)\n")
    bad = subprocess.run([sys.executable, "-c", code, "algorithms.fedprox.muu=0.1"],
                         capture_output=True, text=True)
    assert bad.returncode == 3, bad.stderr
    assert bad.stdout.strip() == ("UnknownKeyError invalid config: algorithms.fedprox.muu=0.1; "
                                  "allowed: a key of algorithms.fedprox (did you mean "
                                  "algorithms.fedprox.mu?)")


def test_a_misspelt_group_option_is_one_line_as_dvc_composes(repo_root, tmp_path):
    """`dvc exp run -S study=clasification` fails while Hydra loads the defaults, before the
    override step: the plugin turns it into fedpipe's line naming the closest option."""
    code = ("import sys; from dvc.utils.hydra import compose_and_dump\n"
            "try:\n"
            f"    compose_and_dump({str(tmp_path / 'p.yaml')!r}, {str(repo_root / 'conf')!r}, None, "
            f"'config', {str(repo_root)!r}, sys.argv[1:])\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e); sys.exit(3)\n")
    bad = subprocess.run([sys.executable, "-c", code, "study=clasification"], capture_output=True,
                         text=True)
    assert bad.returncode == 3, bad.stderr
    assert bad.stdout.strip() == ("UnknownKeyError invalid config: study=clasification; allowed: a "
                                  "file of conf/study/ (did you mean classification?)")


def test_a_real_setting_that_conf_does_not_write_is_told_apart_from_a_misspelling():
    """dataset.holdout_fraction is a field of the digits' config that conf/dataset/digits.yaml does
    not write: the line says to add it with +, not "did you mean dataset.test_fraction?"."""
    cfg = OmegaConf.create({"dataset": {"name": "digits", "test_fraction": 0.25},
                            "fl": {"rounds": 3}, "partition": {"scheme": "iid"}})
    assert unknown_key_message(cfg, "dataset.holdout_fraction", "0.2") == (
        "invalid config: dataset.holdout_fraction=0.2; dataset.holdout_fraction is a setting of "
        "dataset that its conf/ file does not write: add it with +dataset.holdout_fraction=0.2")
    assert "did you mean dataset.test_fraction?" in unknown_key_message(cfg, "dataset.test_fractio",
                                                                        "0.2")
    assert "+fl.checkpoint_every=3" in unknown_key_message(cfg, "fl.checkpoint_every", "3")
