"""The classification track does not depend on the diffusion track (DVC's graph, from the project's
dvc.yaml and the params each study composes), and the study keys that shape the graph are checked."""

import shutil

import networkx as nx
import pytest
from dvc.repo import Repo

from fedpipe.config import ConfigError
from fedpipe.config.core import build
from fedpipe.config.fl import StudyConfig
from fedpipe.pipeline.compose import compose_params
from fedpipe.pipeline.plan import write_plan
from fedpipe.pipeline.server_inputs import needed_kinds

DIFFUSION = ("feature_extractor", "warmup", "generate", "aux_quality", "federate_ddpm")


def graph(repo_root, tmp_path, study):
    """(stage names, names upstream of ``evaluate``) of the DAG that ``dvc exp run -S study=<study>``
    would build."""
    shutil.copytree(repo_root / "conf", tmp_path / "conf")
    shutil.copy(repo_root / "dvc.yaml", tmp_path / "dvc.yaml")
    compose_params(tmp_path, [f"study={study}"])
    Repo.init(tmp_path, no_scm=True)
    with Repo(tmp_path) as repo:
        g = repo.index.graph
        names = {s.name: s for s in g.nodes}
        upstream = {s.name for s in nx.descendants(g, names["evaluate"])}
    return set(names), upstream


def family(names):
    return {n.split("@")[0] for n in names}


def test_a_classification_study_has_no_diffusion_stage(repo_root, tmp_path):
    names, upstream = graph(repo_root, tmp_path, "classification")
    assert family(names) & set(DIFFUSION) == {"feature_extractor"}  # shared, once, a placeholder
    assert "partition@0" in upstream and "federate@fedavg-0" in upstream
    assert not family(upstream) & set(DIFFUSION)


def test_the_default_studys_classification_track_does_not_wait_for_generation(repo_root, tmp_path):
    names, upstream = graph(repo_root, tmp_path, "default")
    assert {"warmup@0", "generate@0", "federate_ddpm@fedddpm-0"} <= names
    assert not family(upstream) & set(DIFFUSION)  # `dvc repro evaluate`: classification only


def test_a_study_whose_method_reads_the_generated_set_waits_for_it(repo_root, tmp_path):
    _, upstream = graph(repo_root, tmp_path, "perada_kd_data")
    assert {"server_data@0", "generate@0", "warmup@0"} <= upstream


def study(**kw):
    return {"algorithms": ["fedavg"], "diffusion_algorithms": [], "seeds": [0, 1]} | kw


@pytest.mark.parametrize("changes, key", [
    ({"diffusion_seeds": [0]}, "study.diffusion_seeds"),             # neither [] nor the seeds
    ({"server_data_from": "warmup"}, "study.server_data_from"),
    ({"diffusion_seeds": [], "diffusion_algorithms": ["fedavg"]}, "study.diffusion_algorithms"),
    ({"diffusion_seeds": [], "server_data_from": "generate"}, "study.server_data_from"),
])
def test_study_keys_that_shape_the_graph_are_checked(changes, key, tmp_path):
    with pytest.raises(ConfigError) as e:
        build(StudyConfig, study(**changes), "study").check_graph()
    assert e.value.key == key
    with pytest.raises(ConfigError) as e:  # the plan stage refuses them before any compute
        write_plan({"study": study(**changes), "algorithms": {"fedavg": {}}}, tmp_path)
    assert e.value.key == key


def test_the_graph_keys_accept_both_tracks_and_classification_only():
    for ok in (study(diffusion_seeds=[0, 1], server_data_from="generate"), study(diffusion_seeds=[]),
               study()):  # null (a params file without the key): as study.seeds
        build(StudyConfig, ok, "study").check_graph()


def test_a_method_that_reads_the_generated_set_needs_server_data_from_generate():
    params = {"study": study(algorithms=["fedavg", "feddf"], diffusion_seeds=[0, 1]),
              "algorithms": {"fedavg": {}, "feddf": {}}}
    with pytest.raises(ConfigError) as e:
        needed_kinds(params)
    assert e.value.key == "study.server_data_from" and "feddf" in str(e.value)
    params["study"]["server_data_from"] = "generate"
    assert needed_kinds(params) == {"distill": ["feddf"]}
