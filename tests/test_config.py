"""Bad params: one line naming key, value and what is allowed; exit 2 before any data is loaded."""

import subprocess
import sys

import pytest
import yaml

from fedpipe.config import ConfigError
from fedpipe.pipeline.partition import partition_stage_config

GOOD = {"seed": 0, "dataset": {"name": "digits"},
        "partition": {"scheme": "dirichlet", "num_clients": 10, "alpha": 0.5}}


def with_(section: str, **kv) -> dict:
    params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in GOOD.items()}
    params[section] = {**params[section], **kv}
    return params


BAD = [
    (with_("partition", alpha=0), "partition.alpha=0.0", "> 0"),
    (with_("partition", alpha=-1.5), "partition.alpha=-1.5", "> 0"),
    (with_("partition", num_clients=5000), "partition.num_clients=5000", "1347 training samples"),
    (with_("partition", num_clients=0), "partition.num_clients=0", ">= 1"),
    (with_("partition", num_clients=10, min_size=200), "partition.min_size=200", "at most 134"),
    ({**GOOD, "partition": {"scheme": "shards", "num_clients": 700, "shards_per_client": 2}},
     "partition.shards_per_client=2", "1400 shards cannot be dealt"),
    (with_("dataset", name="imagenet"), "dataset.name='imagenet'", "digits"),
    (with_("partition", scheme="random"), "partition.scheme='random'", "dirichlet"),
    (with_("partition", alpah=0.1), "partition.alpah=0.1", "known keys of partition"),
    ({**GOOD, "partition": {"scheme": "shards", "alpha": 0.1}}, "partition.alpha=0.1",
     "known keys of partition"),
    (with_("dataset", test_fraction=0.9), "dataset.test_fraction=0.9", "[0.05, 0.5]"),
    (with_("partition", num_clients="ten"), "partition.num_clients='ten'", "an integer"),
    (with_("partition", feature_skew="blur"), "partition.feature_skew='blur'", "rotation"),
    ({**GOOD, "partition": {"scheme": "pathological", "classes_per_client": 11}},
     "partition.classes_per_client=11", "10 classes"),
    ({**GOOD, "partition": {"scheme": "label_blocks", "num_clients": 10, "groups": [4, 5]}},
     "partition.groups=[4, 5]", "num_clients=10"),
    ({**GOOD, "partition": {"scheme": "label_blocks", "num_clients": 10, "blocks": [6, 6]}},
     "partition.blocks=[6, 6]", "10 classes"),
    ({**GOOD, "sed": 1}, "sed=1", "top-level sections"),
    ({**GOOD, "seed": -1}, "seed=-1", ">= 0"),
]


@pytest.mark.parametrize("params,key_value,allowed", BAD)
def test_bad_config_one_line(params, key_value, allowed):
    with pytest.raises(ConfigError) as info:
        partition_stage_config(params)
    msg = str(info.value)
    assert "\n" not in msg
    assert key_value in msg and allowed in msg


def test_good_config_builds():
    cfg = partition_stage_config(GOOD)
    assert cfg.partition.alpha == 0.5 and cfg.dataset.train_size() == 1347


def run_stage(tmp_path, params: dict, seed: str = "0") -> subprocess.CompletedProcess:
    """``stages/partition.py <seed>``: the stage ``partition@<seed>`` run by hand."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return subprocess.run([sys.executable, str(REPO_STAGE), seed], cwd=tmp_path, capture_output=True,
                          text=True, env={**__import__("os").environ, "FEDPIPE_TRACKING": "off"})


from pathlib import Path  # noqa: E402

REPO_STAGE = Path(__file__).resolve().parents[1] / "stages" / "partition.py"


def test_stage_exits_2_with_one_line_and_keeps_outputs(tmp_path):
    out = tmp_path / "data" / "partition" / "seed_0"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text('{"old": 1}\n')
    proc = run_stage(tmp_path, with_("partition", alpha=-1))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: invalid config: partition.alpha=-1.0; allowed: a number > 0"]
    assert (out / "metrics.json").read_text() == '{"old": 1}\n'
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]


def test_stage_missing_dataset_exits_2(tmp_path):
    proc = run_stage(tmp_path, {"seed": 0, "dataset": {"name": "mnist", "root": "raw"},
                                "partition": {"scheme": "iid"}})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "raw/MNIST/raw" in line and not (tmp_path / "data").exists()


def test_stage_runs_and_writes_outputs(tmp_path):
    proc = run_stage(tmp_path, {"seed": 0, "dataset": {"name": "digits"},
                                "partition": {"scheme": "shards", "num_clients": 8}}, seed="3")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "data" / "partition").iterdir()] == ["seed_3"]
    out = tmp_path / "data" / "partition" / "seed_3"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["clients.csv", "heatmap.png", "metrics.json", "partition.safetensors",
                     "sizes.png"]
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def committed(repo: Path) -> str:
    """params.yaml as committed where the workspace's conf/ is the committed one (a `dvc exp run`
    leaves its experiment's params.yaml in the workspace: not what this test is about); the
    workspace's file while conf/ has uncommitted edits (then `make params` must have followed)."""
    import subprocess

    git = ["git", "-C", str(repo)]
    same_conf = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "conf", "hydra_plugins"],
                               capture_output=True).returncode == 0
    head = subprocess.run([*git, "show", "HEAD:params.yaml"], capture_output=True, text=True)
    if same_conf and head.returncode == 0:
        return head.stdout
    return (repo / "params.yaml").read_text()


def test_committed_params_yaml_is_what_conf_composes(tmp_path):
    """`dvc repro` (the quick start) reads params.yaml as committed; `dvc exp run` composes conf/
    afresh. The two must agree, or the default study silently runs other settings than conf/
    says (params.yaml went without FedDDPM's new keys after they were added to conf/: `make params`
    rewrites it)."""
    from fedpipe.pipeline.compose import compose_params

    repo = Path(__file__).resolve().parents[1]
    composed = compose_params(repo, [], output=str(tmp_path / "params.yaml"))

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out
    want, have = flat(yaml.safe_load(composed.read_text())), flat(yaml.safe_load(committed(repo)))
    differ = sorted(k for k in want.keys() | have.keys() if want.get(k, "-") != have.get(k, "-"))
    assert not differ, f"params.yaml differs from conf/ at {differ[:10]}: run `make params`"


def test_every_study_composes_a_section_for_each_of_its_methods_and_restates_no_default():
    """A study that names a method needs its `algorithms.<name>` section (each federate stage declares
    it as a DVC param; DVC stops at the stage where it is missing): composition adds it for every
    method of the study and keeps no other (hydra_plugins/fedpipe_overrides.py). conf/ sets only
    what differs from a method's dataclass defaults, the one source of them."""
    import dataclasses
    import json
    import subprocess
    import sys

    from fedpipe.algorithms import ALGORITHMS

    repo = Path(__file__).resolve().parents[1]
    studies = sorted(p.stem for p in (repo / "conf" / "study").glob("*.yaml"))
    code = ("import sys, json, tempfile, yaml\n"
            "from dvc.utils.hydra import compose_and_dump\n"
            "out = {}\n"
            "def keys(d, pre=''):\n"
            "    for k, v in d.items():\n"
            "        yield pre + k\n"
            "        if isinstance(v, dict):\n"
            "            yield from keys(v, pre + k + '.')\n"
            "for s in sys.argv[1:]:\n"
            "    f = tempfile.mktemp(suffix='.yaml')\n"
            f"    compose_and_dump(f, {str(repo / 'conf')!r}, None, 'config', {str(repo)!r}, "
            "[f'study={s}'])\n"
            "    p = yaml.safe_load(open(f))\n"
            "    out[s] = [p['study']['algorithms'] + p['study']['diffusion_algorithms'], "
            "sorted(p['algorithms']), sorted(keys(p))]\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, *studies], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    composed = json.loads(proc.stdout.splitlines()[-1])
    assert sorted(composed) == studies
    # the single keys a stage lists (``fid.extractor``; tests/test_dvc_params.py) are in every study
    from fedpipe.pipeline.stage_params import METHOD_SECTION, STAGE_PARAMS

    dotted = {p for keys in STAGE_PARAMS.values() for p in keys
              if "." in p and p != METHOD_SECTION}
    assert dotted
    for study, (methods, sections, keys) in composed.items():
        assert sorted(set(methods)) == sections, study
        assert dotted <= set(keys), (study, sorted(dotted - set(keys)))
    conf = yaml.safe_load((repo / "conf" / "algorithms" / "default.yaml").read_text())
    for name, section in conf.items():
        defaults = ALGORITHMS[name].config_class()
        same = [k for k, v in section.items() if dataclasses.is_dataclass(defaults)
                and getattr(defaults, k, object()) == v]
        assert not same, f"conf/algorithms/default.yaml restates {name}'s defaults: {same}"
