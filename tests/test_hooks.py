"""A strategy's hooks, grouped by where they run (fedpipe.fl.strategy): the groups cover the base
class exactly once, an executor touches a strategy's client side only, and a batchable method states
its local objective once (``local_plan``), which the serial and the batched executors both train."""

from __future__ import annotations

import pytest
import torch
from test_batched import LOCALS, SIZES, Net, make_clients

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.fl.batched import BatchedExecutor, supports_batching
from fedpipe.fl.executors import SerialExecutor
from fedpipe.fl.state import Payload
from fedpipe.fl.strategy import (
    ClientSide,
    Evaluation,
    Method,
    ServerSide,
    Strategy,
    hook_groups,
    hook_table,
)
from fedpipe.tasks import ClassificationTask

GROUPS = {"client": ClientSide, "server": ServerSide, "evaluation": Evaluation}


def own_names(cls) -> set[str]:
    return {k for k in vars(cls) if not k.startswith("__")}


def test_every_public_member_of_the_base_lives_in_exactly_one_group():
    groups = [own_names(c) for c in (Method, ClientSide, ServerSide, Evaluation)]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b, f"in two groups: {sorted(a & b)}"
    public = {k for k in dir(Strategy) if not k.startswith("_")}
    assert public <= set().union(*groups), sorted(public - set().union(*groups))
    assert not own_names(Strategy) - {"_abc_impl"}, "Strategy itself adds no member: it is the union"


def test_the_client_side_holds_what_an_executor_runs_and_nothing_else():
    assert own_names(ClientSide) == {"init_client", "probe", "local_plan", "client_update",
                                     "finish_update"}
    assert {"aggregate", "server_update", "payload", "select_clients"} <= own_names(ServerSide)
    assert {"personalized_model", "global_model", "has_global_model"} <= own_names(Evaluation)


class ClientOnly:
    """The strategy as an executor may see it: any member of a server or evaluation group raises."""

    FORBIDDEN = own_names(ServerSide) | own_names(Evaluation)

    def __init__(self, strategy: Strategy):
        object.__setattr__(self, "_s", strategy)
        object.__setattr__(self, "seen", set())

    def __getattr__(self, name):
        if name in ClientOnly.FORBIDDEN:
            raise AssertionError(f"an executor read the server/evaluation member {name!r}")
        self.seen.add(name)
        return getattr(self._s, name)


def jobs_and_payloads(strategy: Strategy, model: torch.nn.Module):
    state = strategy.init_server(model)  # the server's work, done here, not by the executor
    clients = make_clients(SIZES[:4])
    payloads = {cid: strategy.payload(state, 0, cid) for cid in range(len(clients))}
    jobs = [(cid, strategy.init_client(cid), data) for cid, data in enumerate(clients)]
    return payloads, jobs


@pytest.mark.parametrize("executor", [SerialExecutor, BatchedExecutor])
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "fedper", "ditto"])
def test_executors_touch_the_client_side_only(name, executor):
    local = LOCALS["sgd"]
    strategy = ALGORITHMS[name](ClassificationTask(), Net, local, algorithm_config(name, {}),
                                num_clients=4)
    payloads, jobs = jobs_and_payloads(strategy, Net())
    guarded = ClientOnly(strategy)
    results = executor().run(guarded, payloads, jobs, seed=1)
    assert len(results) == len(jobs) and all(r[0].num_samples == len(d)
                                             for r, (_, _, d) in zip(results, jobs, strict=True))
    assert guarded.seen & {"client_update", "local_plan"}
    probes = executor().probe(guarded, payloads, jobs, seed=1)
    assert sorted(probes) == [cid for cid, _, _ in jobs]


def test_the_guard_itself_refuses_a_server_hook():
    guarded = ClientOnly(ALGORITHMS["fedavg"](ClassificationTask(), Net, LOCALS["sgd"]))
    with pytest.raises(AssertionError, match="aggregate"):
        guarded.aggregate  # noqa: B018


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "fedper"])
def test_a_batchable_method_states_its_local_step_as_a_plan_only(name):
    """No batchable method writes a ``client_update`` of its own: the base one trains its
    ``local_plan`` serially, the batched executor the same plan vectorised."""
    cls = ALGORITHMS[name]
    assert supports_batching(cls(ClassificationTask(), Net, LOCALS["sgd"]))
    owner = next(c for c in cls.__mro__ if "client_update" in vars(c))
    assert owner is ClientSide, f"{name}'s client_update comes from {owner.__name__}"


def test_fedprox_plan_is_eq2_and_the_serial_step_trains_it():
    """The serial step of FedProx's plan is local SGD on F_k(w) + mu/2 ||w - w^t||^2: one step of
    plain SGD from w^t, where the proximal gradient mu (w - w^t) is still zero, then a second step
    whose proximal gradient is mu times the first step's displacement (hand-computed here)."""
    from fedpipe.config.fl import LocalTrainConfig

    torch.manual_seed(0)
    local = LocalTrainConfig(steps=2, batch_size=64, lr=0.5, momentum=0.0)
    mu = 3.0
    prox = ALGORITHMS["fedprox"](ClassificationTask(), Net, local,
                                 algorithm_config("fedprox", {"mu": mu}))
    w0 = {k: v.clone() for k, v in Net().state_dict().items()}
    data = make_clients([10])[0]
    plan = prox.local_plan(Payload(round=0, weights=w0), {}, data)
    assert plan.prox_mu == mu and set(plan.prox_centre) == {n for n, _ in Net().named_parameters()}

    update, _, _ = prox.client_update(Payload(round=0, weights=w0), {}, data,
                                      torch.Generator().manual_seed(4))
    # the same two steps by hand: plain gradients of the task loss, plus mu (w - w0)
    model = Net()
    model.load_state_dict(w0)
    x, y = data.x, data.y  # one batch of all 10 samples per step (batch 64 > 10)
    for _ in range(2):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for n, p in model.named_parameters():
                p -= local.lr * (p.grad + mu * (p - w0[n]))
    for n, v in model.state_dict().items():
        torch.testing.assert_close(update.weights[n], v, rtol=1e-6, atol=1e-7)


def test_hook_table_names_each_methods_own_hooks_by_group():
    groups = hook_groups(ALGORITHMS["scaffold"])
    assert groups["client"] == ["local_plan", "finish_update"]
    assert groups["server"] == ["init_server", "payload", "aggregate"]
    assert groups["evaluation"] == []
    assert hook_groups(ALGORITHMS["fedper"])["declared"] == ["personal_modules"]
    table = hook_table(ALGORITHMS)
    assert table.count("\n") == len(ALGORITHMS) + 2  # header, rule, one row per method


def test_architecture_doc_carries_the_current_hook_table():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    begin, end = "<!-- hook-table: begin -->\n", "<!-- hook-table: end -->"
    assert begin in doc and end in doc
    shown = doc.split(begin, 1)[1].split(end, 1)[0]
    assert shown == hook_table(ALGORITHMS), \
        "docs/architecture.md's hook table is stale: python -m fedpipe.algorithms --write " \
        "docs/architecture.md"


def test_the_hook_table_is_written_between_its_markers(tmp_path):
    import subprocess
    import sys

    doc = tmp_path / "a.md"
    doc.write_text("# t\n<!-- hook-table: begin -->\nold rows\n<!-- hook-table: end -->\nafter\n")
    subprocess.run([sys.executable, "-m", "fedpipe.algorithms", "--write", str(doc)], check=True)
    assert doc.read_text() == ("# t\n<!-- hook-table: begin -->\n" + hook_table(ALGORITHMS)
                               + "<!-- hook-table: end -->\nafter\n")
