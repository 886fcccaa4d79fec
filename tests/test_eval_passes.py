"""The evaluate stage's passes over the test sets: one pass of each model per set
(``ClassificationTask.correct_sets``), a shared body for models that differ only in their head, PM
scores from stored predictions, and eval mode switched only when needed. Each against the plain
per-model computation the stage did before, bit for bit (accuracies are counts of argmax hits, so
any change of the forward's arithmetic would show as a changed count on some input)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fakes import default_params, with_changes
from torch import nn

from fedpipe.metrics import (
    client_accuracy_summary,
    per_client_accuracy,
    pm_accuracy,
    pm_accuracy_of,
    train_class_counts,
)
from fedpipe.models import build_model
from fedpipe.tasks import ClassificationTask, evaluating, head_only_difference

TASK = ClassificationTask()
REPO = Path(__file__).resolve().parents[1]


def resnet8(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("resnet8", (1, 8, 8), 10)


def with_head_of(model: nn.Module, seed: int) -> nn.Module:
    """A copy of ``model`` with another head (a FedRep / FedPer personal model)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out.head.weight.copy_(torch.randn(out.head.weight.shape, generator=g))
        out.head.bias.copy_(torch.randn(out.head.bias.shape, generator=g))
    return out


def sets_of(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Test sets of 23, 0 and 9 images (23 > the batch size 7 used below: several batches)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
            for n in (23, 0, 9)]


def test_shared_body_gives_each_models_own_predictions_bit_for_bit():
    base = resnet8(0)
    with torch.no_grad():  # BN statistics away from their initial values (eval mode reads them)
        for name, b in base.named_buffers():
            if name.endswith("running_mean"):
                b.normal_(0, 0.3)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
    models = [base] + [with_head_of(base, s) for s in (1, 2, 3)]
    assert head_only_difference(models)
    sets = sets_of(4)
    got = TASK.correct_sets(models, sets, batch_size=7)
    for m, per_set in zip(models, got, strict=True):
        for (x, y), c in zip(sets, per_set, strict=True):
            with torch.inference_mode():  # the plain forward, one batch at a time
                m.eval()
                ref = torch.cat([m(x[i:i + 7]).argmax(1) == y[i:i + 7] for i in range(0, len(y), 7)]
                                ) if len(y) else torch.zeros(0, dtype=torch.bool)
            assert c.dtype == torch.bool and torch.equal(c, ref)
    # the heads differ, so the predictions do: a shared head would have failed the loop above
    assert not torch.equal(got[1][0], got[2][0]) or not torch.equal(got[1][2], got[2][2])
    # and the logits themselves are the same bits as each model's own forward
    x = sets[0][0]
    with torch.inference_mode():
        feats = base.features(x)
        for m in models:
            assert torch.equal(m.head(feats), m(x))


def test_models_with_another_body_are_scored_one_by_one():
    a, b = resnet8(0), resnet8(1)
    moved = with_head_of(a, 5)
    with torch.no_grad():
        moved.body.bn1.running_mean.add_(0.1)  # a buffer outside the head differs
    for group in ([a, b], [a, moved]):
        assert not head_only_difference(group)
        sets = sets_of(6)
        got = TASK.correct_sets(group, sets)
        for m, per_set in zip(group, got, strict=True):
            for (x, y), c in zip(sets, per_set, strict=True):
                assert torch.equal(c, TASK.correct(m, x, y))
    assert not head_only_difference([nn.Linear(2, 2), nn.Linear(2, 2)])  # not a Classifier


def test_eval_mode_is_switched_only_when_a_module_trains_and_restored():
    m = resnet8(0)
    x, y = sets_of(0)[0]
    TASK.correct(m, x, y)
    assert m.training and all(s.training for s in m.modules())  # back in train mode
    m.eval()
    m.body.bn1.train()  # mixed: the root evaluates, one BN trains
    with evaluating(m):
        assert not any(s.training for s in m.modules())
    assert not m.training and not m.body.bn1.training  # as model.train(False) leaves it
    m.eval()
    TASK.evaluate(m, x, y)
    assert not any(s.training for s in m.modules())


def test_pm_from_stored_predictions_equals_pm_of_the_models():
    models = [resnet8(s) for s in range(3)]
    x, y = sets_of(1)[0]
    counts = np.array([[3, 0, 1, 0, 0, 0, 0, 0, 0, 2], [0, 5, 5, 0, 0, 0, 0, 0, 0, 0],
                       [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
    correct = [TASK.correct(m, x, y) for m in models]
    for mode in ("V", "L"):
        for weighted in (True, False):
            np.testing.assert_array_equal(
                pm_accuracy_of(correct, y, counts, mode, weighted),
                pm_accuracy(models, x, y, counts, mode, TASK, weighted))
    assert np.isnan(pm_accuracy_of([None, correct[1], None], y, counts, "V")[[0, 2]]).all()
    with pytest.raises(ValueError, match="one row per"):
        pm_accuracy_of(correct[:2], y, counts, "V")


def reference_evaluate_run(cfg, run, ds, local_tests, task, train_counts, corrupted):
    """The evaluate stage's run metrics as it computed them before (one fresh model per client in
    train mode, each scored on every set by ``task.correct`` / ``task.evaluate``, PM(V), PM(L) and
    the Global-test accuracy each with its own pass), for the keys this test compares."""
    from fedpipe.io import load_tensors
    from fedpipe.pipeline.common import make_model
    from fedpipe.pipeline.outputs import load_personal

    def corrupt(models):
        names = sorted({n for n, _ in corrupted})
        return [float(np.mean([np.mean([float(task.correct(m, s.x, s.y).double().mean())
                                        for (n, _), s in corrupted.items() if n == name])
                               for name in names])) for m in models]

    model = make_model(cfg, ds)
    weights = load_tensors(run / "model.safetensors")
    model.load_state_dict(weights)
    glob = task.evaluate(model, ds.test.x, ds.test.y)
    generic = per_client_accuracy(model, local_tests, task, cfg.seed)
    m = {"test_accuracy": glob["accuracy"], "test_loss": glob["loss"],
         **client_accuracy_summary(generic), "corrupt_accuracy": corrupt([model])[0]}
    personal = load_personal(run, weights)
    if not personal:  # a method without personal models (FedAvg, FedDF)
        return m, generic, None
    models = []
    for c in range(len(local_tests)):
        pm = make_model(cfg, ds)
        pm.load_state_dict(personal[c])
        models.append(pm)
    own = per_client_accuracy(models, local_tests, task, cfg.seed)
    m |= {k.replace("client_acc", "personal_acc"): v for k, v in client_accuracy_summary(own).items()}
    for mode in ("V", "L"):
        pm = pm_accuracy(models, ds.test.x, ds.test.y, train_counts, mode, task)
        m[f"pm_{mode.lower()}_mean"] = float(np.nanmean(pm))
        m[f"pm_{mode.lower()}_client_std"] = float(np.nanstd(pm))
    m["personal_global_mean"] = float(np.mean(
        [task.evaluate(pm, ds.test.x, ds.test.y)["accuracy"] for pm in models]))
    m["personal_corrupt_mean"] = float(np.mean(corrupt(models)))
    return m, generic, own


@pytest.mark.parametrize("algorithm", ["fedrep", "ditto"])  # head-only personal models, whole ones
def test_evaluate_run_equals_the_per_model_computation(tmp_path, algorithm):
    """Two rounds of training on the digits with resnet8, then the stage's run metrics against
    :func:`reference_evaluate_run`: every compared number equal (==, not approximately)."""
    from fedpipe.data import load_dataset
    from fedpipe.data.corruptions import corrupted_test_sets
    from fedpipe.pipeline.common import clients_of, load_partition, train_config
    from fedpipe.pipeline.evaluate import evaluate_run
    from fedpipe.pipeline.federate import federate
    from fedpipe.pipeline.inputs import partition_file
    from fedpipe.pipeline.partition import partition_and_write, partition_stage_config

    params = default_params()
    p = with_changes(params, **{"fl/rounds": 2, "fl/eval_every": 2, "fl/local/epochs": 1,
                                "model/name": "resnet8", "model/kwargs": {},
                                "partition/num_clients": 4, "study/algorithms": [algorithm],
                                "study/seeds": [0], "algorithms/fedrep/head_epochs": 1,
                                "algorithms/fedrep/body_epochs": 1})
    partition_and_write(partition_stage_config(p, 0), tmp_path / "part" / "seed_0")
    cfg = train_config(p, algorithm, 0)
    federate(cfg, tmp_path / "fed", partition_file(0, tmp_path / "part"), progress=False)
    part = load_partition(partition_file(0, tmp_path / "part"), 0)
    ds = load_dataset(cfg.dataset)
    local = clients_of(ds, part, "test")
    counts = train_class_counts([c.y for c in clients_of(ds, part)], ds.meta.num_classes)
    corrupted = corrupted_test_sets(ds, ["gaussian_noise", "contrast"], [1, 5], 0,
                                    cache_dir=tmp_path / "corrupt")
    run = tmp_path / "fed" / algorithm / "seed_0"
    m, generic, own = evaluate_run(cfg, run, ds, local, TASK, counts, corrupted)
    ref, ref_generic, ref_own = reference_evaluate_run(cfg, run, ds, local, TASK, counts, corrupted)
    np.testing.assert_array_equal(generic, ref_generic)
    np.testing.assert_array_equal(own, ref_own)
    assert len(ref) == 21  # generic 8 + corrupted 1 + personal 6 + PM 4 + Global-test + corrupted
    for k, v in ref.items():
        assert m[k] == v or (math.isnan(v) and math.isnan(m[k])), k
    assert 0 < m["personal_corrupt_mean"] < 1 and m["personal_global_mean"] != m["test_accuracy"]
