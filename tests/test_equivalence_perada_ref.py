"""PerAda and PerAda w/o KD against the official code (NVlabs/PerAda), driven on the same tiny float64
model, weights, batches and dropout masks. The reference's numbers are fixtures
(tests/fixtures/equivalence/perada.safetensors, perada_nokd.safetensors; how they were made:
README_perada.md in that folder); no reference code runs here.

The model is a one-stage ResNet-8 (3x3 stem conv + BN, one BasicBlock of width 4 with its two
adapters, average pool, linear head) on 2 x 5 x 5 inputs: every kind of entry of PerAda's adapter
set (adapters, stem and block BNs, head) and frozen convolutions, and no downsample shortcut. Two
rounds of three clients, every client in both rounds; per client the personal objective (CE +
lam ||v - w^t||^2) then the local adapter, 2 full-batch epochs of plain SGD each; the server's
uniform average, then (PerAda) 3 Adam steps of ensemble distillation on 8 unlabelled inputs. The
adapters' dropout (p = 0.3) is on: both sides draw its masks from torch's global RNG seeded with the
same seed before each training call (the fixture's ``dropout_seeds``; fedpipe's seeding through
``global_rng_from`` is replaced by those seeds here, nothing else).

What the setup keeps apart (docs/papers/perada.md, "Against the official code"):
- where a client's personal adapter starts at its first round (the code: the initial model w^0;
  fedpipe at the time of writing: the w^t it receives): every client takes part from round 0, where
  the two are equal;
- the downsample BNs' running statistics (the code keeps each client's own; fedpipe the server's):
  the model has none, so personalized and teacher models agree in eval mode;
- teachers in eval mode (fedpipe) against train mode (the code): ``out.*`` ran the code with its
  teachers put in eval mode, ``out_asis.*`` unmodified; the difference is measured below;
- the code's choice of the KD checkpoint on a labelled validation split: neutralised in the
  reference run (the last of the R steps is kept, Alg. 1's w^{t,R}, as in fedpipe).

Tolerance 1e-10: values are O(1) and a few hundred float64 operations deep, so rounding stays near
1e-14 (batch order inside a full batch differs between the two sides); a missing or doubled term moves
them by 1e-3 or more. The largest difference of each comparison is printed (``pytest -s``).
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from test_equivalence_flbench_ref import Fixture, max_diff, moved

import fedpipe.algorithms.feddf as feddf_module
import fedpipe.algorithms.perada as perada_module
from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl import RoundInfo, ServerData
from fedpipe.models.adapters import ResNet8
from fedpipe.tasks import ClassificationTask

DT = torch.float64
TOL = 1e-10


def check(what: str, diff: float, tol: float = TOL) -> float:
    print(f"{what}: max abs difference {diff:.3g}")
    assert diff <= tol, f"{what}: {diff:.3g} > {tol:.0e}"
    return diff


@pytest.fixture
def seeded_dropout(monkeypatch):
    """The reference's randomness: fedpipe's ``global_rng_from(gen)`` (which seeds torch's global RNG,
    where dropout draws its masks, from the client's or server's stream) replaced by the fixture's
    seeds, in call order, and every shuffle (``torch.randperm``: local batches, distillation batches)
    the identity, as the reference's one-batch loaders are. A dropout mask is drawn per row, so with
    dropout on the two sides agree only when row i is the same sample on both. Returns the list of
    seeds not yet used."""

    def install(seeds: list[int]) -> list[int]:
        queue = list(seeds)
        monkeypatch.setattr(torch, "randperm", lambda n, generator=None, device=None, **kw:
                            torch.arange(n, device=device))

        @contextmanager
        def seeded(gen: torch.Generator):
            with torch.random.fork_rng():
                torch.manual_seed(queue.pop(0))
                yield

        monkeypatch.setattr(perada_module, "global_rng_from", seeded)
        monkeypatch.setattr(feddf_module, "global_rng_from", seeded)
        return queue

    return install


def make(name: str, fx: Fixture):
    h = fx.hyper
    cfg = algorithm_config(name, {"lam": h["lmbda"], "adapter_dropout": h["adapter_dropout"],
                                  "kd_steps": h["kd_steps"], "kd_batch_size": h["kd_batch_size"],
                                  "kd_lr": h["kd_lr"], "kd_temperature": h["kd_temperature"],
                                  "backbone": "none", "server_data": "distill"})
    cls = ALGORITHMS[name]

    def model_fn():
        with torch.random.fork_rng():
            m = cls.adapt_model(ResNet8((2, 5, 5), 3, widths=(4,)), cfg).to(DT)
        m.load_state_dict(fx.w0)
        return m

    local = LocalTrainConfig(epochs=h["epochs"], batch_size=64, lr=h["lr"])  # plain SGD, as the code
    return cls(ClassificationTask(), model_fn, local, cfg, aggregation="uniform",
               num_clients=fx.num_clients)


def logits(s, weights, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return s.model_of(weights).eval()(x)


def run(s, fx: Fixture):
    """``rounds`` rounds of every client, as the engine runs them; yields (round, averaged state,
    server state, client states, updates)."""
    data = [fx.data(i) for i in range(fx.num_clients)]
    aux = ClientData(fx.t["aux.x"], torch.full((len(fx.t["aux.x"]),), -1))
    server_data = ServerData("distill", aux, labelled=False)
    state = s.init_server(s.model_fn())
    cstates = [s.init_client(i) for i in range(len(data))]
    for r in range(fx.hyper["rounds"]):
        updates = []
        for cid, d in enumerate(data):
            gen = torch.Generator().manual_seed(100 * r + cid)
            u, cstates[cid], _ = s.client_update(s.payload(state, r, cid), cstates[cid], d, gen, cid)
            updates.append(u)
        rnd = RoundInfo(index=r, total=fx.hyper["rounds"], seed=0, updates=tuple(updates),
                        server_data=server_data, selected=tuple(range(len(data))))
        averaged = s.aggregate(state, rnd)
        state = s.server_update(averaged, rnd)
        yield r, averaged, state, cstates, updates


def check_round(name: str, s, fx: Fixture, r: int, averaged, state, cstates, updates) -> None:
    x = fx.t["test.x"]
    for cid, u in enumerate(updates):
        check(f"{name} round {r} client {cid} local adapter theta",
              max_diff(u.weights, fx.group(f"out.r{r}.theta{cid}")))
        check(f"{name} round {r} client {cid} personal adapter v",
              max_diff(cstates[cid]["personal"], fx.group(f"out.r{r}.v{cid}")))
        gen = torch.Generator().manual_seed(0)
        personal = s.personalized_model(state, cstates[cid], fx.data(cid), gen, cid)
        check(f"{name} round {r} client {cid} personalized logits",
              float((logits(s, personal, x) - fx.t[f"out.r{r}.personal_logits{cid}"]).abs().max()))
        assert moved(u.weights, {k: fx.w0[k] for k in u.weights}) > 1e-3
        assert max_diff(u.weights, cstates[cid]["personal"]) > 1e-3  # v and theta differ
    check(f"{name} round {r} uniform average", max_diff(averaged.weights, fx.group(f"out.r{r}.avg")))
    check(f"{name} round {r} server model", max_diff(state.weights, fx.group(f"out.r{r}.server")))
    check(f"{name} round {r} global logits",
          float((logits(s, state.weights, x) - fx.t[f"out.r{r}.global_logits"]).abs().max()))


def test_perada_fixtures_hold_their_inputs_and_reference():
    for name in ("perada", "perada_nokd"):
        fx = Fixture(name)
        assert fx.info["reference"][0]["repository"] == "NVlabs/PerAda"
        assert fx.num_clients == 3 and len(fx.hyper["dropout_seeds"]) == 2 * 3 * fx.hyper["rounds"]


def test_model_forward_matches_reference():
    """The adapted ResNet's eval-mode forward (stem, block with its two adapters, pool, head) at w^0."""
    fx = Fixture("perada")
    s = make("perada", fx)
    check("forward at w0", float((logits(s, fx.w0, fx.t["test.x"]) - fx.t["w0_logits"]).abs().max()))
    assert set(fx.w0) == set(s.model_fn().state_dict())


@pytest.mark.parametrize("name", ["perada", "perada_nokd"])
def test_clients_and_server_match_reference(name, seeded_dropout):
    """Personal and local adapters, the uniform average, the server model (after KD for PerAda),
    the personalized and global models' logits, in both rounds."""
    fx = Fixture(name)
    s = make(name, fx)
    kd = name == "perada"
    seeds = [*fx.hyper["dropout_seeds"]]
    per_round = len(seeds) // fx.hyper["rounds"]
    order = []
    for r in range(fx.hyper["rounds"]):  # call order: the clients' trainings, then the server's KD
        order += seeds[r * per_round:(r + 1) * per_round]
        order += [fx.hyper["kd_dropout_seeds"][r]] if kd else []
    left = seeded_dropout(order)
    for r, averaged, state, cstates, updates in run(s, fx):
        check_round(name, s, fx, r, averaged, state, cstates, updates)
        distilled = moved(state.weights, averaged.weights)
        assert distilled > 1e-3 if kd else distilled == 0
    assert left == []


def test_teachers_in_eval_mode_is_the_only_kd_difference(seeded_dropout):
    """``out_asis``: the code unmodified, its teachers in train mode (dropout on, batch-statistics
    BN). fedpipe matches the run with eval-mode teachers to rounding and differs from the unmodified
    one by the deviation's effect (recorded in docs/papers/perada.md)."""
    fx = Fixture("perada")
    s = make("perada", fx)
    h = fx.hyper
    seeds = h["dropout_seeds"][:len(h["dropout_seeds"]) // h["rounds"]] + h["kd_dropout_seeds"][:1]
    left = seeded_dropout(seeds)
    _, _, state, _, _ = next(run(s, fx))  # round 0
    assert left == []
    asis = fx.group("out_asis.r0.server")
    effect = max_diff(state.weights, asis)
    check("round 0 server model, eval-mode teachers", max_diff(state.weights, fx.group("out.r0.server")))
    z = logits(s, state.weights, fx.t["test.x"])
    print(f"teachers in train mode (the code as is): server model {effect:.3g}, global logits "
          f"{float((z - fx.t['out_asis.r0.global_logits']).abs().max()):.3g}")
    assert effect > 1e-2
