"""The Strategy: the hooks of one round (round protocol v2; see docs/architecture.md). The base class
is FedAvg (McMahan et al. 2017): clients run local SGD from the global weights; the server averages.

The hooks are grouped by where they run, one base class each, which :class:`Strategy` joins:
:class:`ClientSide` (what an executor runs on a client), :class:`ServerSide` (the server's steps) and
:class:`Evaluation` (the models the evaluation reads), over :class:`Method` (what a method declares
and the helpers every hook shares). :func:`hook_table` lists, per registered method, the hooks it
changes (``python -m fedpipe.algorithms``).

Every hook is a function of explicit inputs (as Flower's strategy hooks are), so any executor can run
the client side:

- ``init_server(model) -> ServerState`` and ``init_client(client_id) -> ClientState`` (named groups of
  tensors, stored per client by the engine);
- ``select_clients(state, round_, available, per_round, rng, probe) -> list[int]``: the round's
  clients. Default: uniform without replacement from ``rng`` (the round's ``client-sampling``
  stream). ``probe(candidates) -> {client_id: metrics}`` asks candidates for cheap information
  (:meth:`ClientSide.probe`, run through the executor; power-of-choice asks for their local loss);
- ``payload(state, round_, client_id) -> Payload``: what each client receives;
- ``client_update(payload, client_state, data, gen, client_id) -> (update, client_state, metrics)``:
  pure; its only randomness is ``gen``. By default it trains ``local_plan(...)`` (a
  :class:`LocalPlan`: the start weights and the local objective's terms) and hands the trained
  weights to ``finish_update(...)``; the batched executor trains the same plan vectorised;
- ``aggregate(state, rnd) -> ServerState`` and ``server_update(state, rnd) -> ServerState``: ``rnd``
  (:class:`RoundInfo`) carries the round, the run's seed (seeded generators), the round's updates
  sorted by client id, the typed server data (:class:`ServerData`) the method declared, and the
  pipeline's model score (FedDDPM+'s QuickTest);
- personalization: ``personal_keys(model)`` names the personal entries of the state dict (by module:
  ``personal_modules = ("head",)`` for FedPer); the base class then keeps them in each client's state,
  trains them with the shared ones, uploads and averages only the shared ones.
  ``personalized_model(state, client_state, data, gen, client_id)`` gives a client's own model for
  evaluation (and may fine-tune it: FedAvg+FT), or None for a method without personal models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl.local import corrected_grad_hook, fix_parameters, local_train, proximal_loss
from fedpipe.fl.state import (
    ClientState,
    ClientUpdate,
    Payload,
    ServerState,
    Weights,
    aggregation_coeffs,
    clone,
    load_weights,
    repeated_names,
    trainable,
    weighted_average,
)
from fedpipe.rng import torch_generator

Probe = Callable[[Sequence[int]], dict[int, dict[str, float]]]
Score = Callable[[nn.Module, int, torch.Generator], float]

SERVER_DATA_KINDS = ("none", "aux", "distill", "holdout", "public")
"""What a method may ask the pipeline for (its config's ``server_data`` field):
``aux`` the auxiliary set the diffusion track generates (labelled when the warm-up is class-
conditional; a task that trains on labels needs it labelled), ``distill`` an unlabelled set for
server-side distillation (by default the same generated set, labels dropped), ``holdout`` the
dataset's held-out real slice of the training pool (``dataset.holdout_fraction``), unlabelled,
``public`` the training images of another dataset (``dataset.public_dataset``), unlabelled."""


@dataclass(frozen=True)
class ServerData:
    """Typed data the server holds: ``kind`` (one of :data:`SERVER_DATA_KINDS`), the samples as
    :class:`ClientData` (labels -1 when unlabelled) and where they came from (for lineage)."""

    kind: str
    data: ClientData
    labelled: bool
    source: str = ""


@dataclass(frozen=True)
class RoundInfo:
    """What the server-side hooks see of a round.

    ``index`` is 0-based, ``total`` is ``fl.rounds``; ``updates`` are the round's client updates
    sorted by client id; ``server_data`` is what the method declared (None otherwise); ``score`` is
    the pipeline's quality score of a model (the FID of ``n`` samples, on the diffusion track)."""

    index: int
    total: int
    seed: int
    updates: tuple[ClientUpdate, ...] = ()
    server_data: ServerData | None = None
    score: Score | None = None
    selected: tuple[int, ...] = field(default_factory=tuple)

    def generator(self, purpose: str = "server-update") -> torch.Generator:
        """The seeded stream ``(seed, purpose, round)`` for the server's randomness."""
        return torch_generator(self.seed, purpose, self.index)


@dataclass(frozen=True)
class NoConfig:
    """An algorithm without hyperparameters of its own."""


def check_num_clients(strategy: Strategy, updates: Sequence[ClientUpdate]) -> None:
    if strategy.num_clients < len(updates):
        raise ValueError(f"{strategy.name}: num_clients={strategy.num_clients} is smaller than the "
                         f"{len(updates)} clients of this round; pass the total number of clients")


def uniform_selection(available: Sequence[int], per_round: int, rng: np.random.Generator
                      ) -> list[int]:
    """``per_round`` distinct clients of ``available``, uniformly without replacement, sorted by id
    (all of them, with no draw, when ``per_round >= len(available)``)."""
    if per_round >= len(available):
        return sorted(available)
    picked = rng.choice(len(available), size=per_round, replace=False)
    return sorted(int(available[int(i)]) for i in picked)


def module_keys(model: nn.Module, prefixes: Sequence[str]) -> set[str]:
    """The state-dict names under the modules ``prefixes`` (``""`` = the whole model)."""
    names = model.state_dict().keys()
    return {k for k in names for p in prefixes if p == "" or k == p or k.startswith(p + ".")}


@dataclass
class LocalPlan:
    """A client's local objective, stated once: every executor trains from it (the serial one with
    :func:`~fedpipe.fl.local.local_train`, the batched one vectorised, :mod:`fedpipe.fl.batched`).

    ``start``: the full state dict the client trains from. ``prox_mu``/``prox_centre``: add
    ``mu/2 ||w - centre||^2`` over the trainable parameters to the loss (FedProx, Eq. 2).
    ``correction``: added to each trainable parameter's gradient after it is computed and before
    clipping (SCAFFOLD's c - c_i, Alg. 1 line 10). ``grad_sum``: keep the sum of the raw
    (uncorrected) gradients of the client's steps (SCAFFOLD's mean-gradient control variate).
    ``context``: anything the method's :meth:`ClientSide.finish_update` needs back."""

    start: Weights
    prox_mu: float = 0.0
    prox_centre: Weights | None = None
    correction: Weights | None = None
    grad_sum: bool = False
    context: dict[str, Any] = field(default_factory=dict)


class Method:
    """What a method declares (class attributes and class methods the pipeline reads before any
    compute), and the model helpers its hooks share. The hooks themselves are grouped by where they
    run: :class:`ClientSide`, :class:`ServerSide`, :class:`Evaluation`."""

    name = "fedavg"
    config_class: type = NoConfig
    personal_modules: tuple[str, ...] = ()
    """Modules whose parameters (and buffers) stay on each client (FedPer: ``("head",)``)."""
    batchable: bool = False
    """Whether ``fl.executor: batched`` may train this method's clients together. The batched
    executor trains from :meth:`ClientSide.local_plan` and hands the result to
    :meth:`ClientSide.finish_update`, as the default :meth:`ClientSide.client_update` does; a method
    that overrides ``client_update`` itself is not batched (:mod:`fedpipe.fl.batched`). Off by
    default: a method declares it on the class whose client step it vouches for; others run serially,
    with one log line."""
    default_backbone: str = "none"
    """Where the method's model starts unless its params say (``algorithms.<name>.backbone``, read
    by the pipeline for every method: :class:`fedpipe.config.fl.InitConfig`). PerAda, whose backbone
    is frozen: ``fedavg``."""
    tracks: tuple[str, ...] = ("classification",)
    """The tracks whose task the method trains: ``classification`` (a classifier, labels), and
    ``diffusion`` for a method that is task-agnostic (its local and server steps only call the task's
    loss: FedAvg, FedProx, SCAFFOLD, ...). The plan refuses a method on a track it does not name."""
    needs_client_groups: bool = False
    """Whether the method reads each client's planted group (GIFAIR-FL's oracle groups); the pipeline
    then requires a partition that has them (``label_blocks``)."""

    def __init__(self, task, model_fn: Callable[[], nn.Module], local: LocalTrainConfig,
                 cfg: Any = None, aggregation: str = "weighted", num_clients: int = 1,
                 client_groups: Sequence[int] | None = None):
        self.task = task
        self.model_fn = model_fn
        self.local = local
        self.cfg = cfg if cfg is not None else self.config_class()
        self.aggregation = aggregation
        self.num_clients = num_clients
        self.client_groups = None if client_groups is None else tuple(int(g) for g in client_groups)
        """The planted group of each client (the ``label_blocks`` partition's ``groups``) when the
        partition has them: oracle groups (GIFAIR-FL) and clustering metrics (Equitable-FL's NMI)
        read it. None otherwise."""
        self._scratch: nn.Module | None = None  # working copy for local training
        self._personal: frozenset[str] | None = None

    # -- declarations ----------------------------------------------------------------------------
    @classmethod
    def server_data_kind(cls, cfg: Any) -> str:
        """The server data this method needs with config ``cfg`` (its ``server_data`` field;
        ``none`` for a method without one)."""
        return getattr(cfg, "server_data", "none")

    @classmethod
    def check_clients(cls, cfg: Any, num_clients: int, per_round: int) -> None:
        """Raise a ConfigError naming the key when this method's config ``cfg`` cannot be honoured
        with ``num_clients`` clients and ``per_round`` of them per round (checked before any data
        loads; a setting is never clamped)."""

    @classmethod
    def adapt_model(cls, model: nn.Module, cfg: Any) -> nn.Module:
        """The network this method trains, made from the study's model (config ``cfg``): the model
        itself by default; FedNH swaps the head for prototypes, FedProto adds a distance head. The
        pipeline applies it to every model it builds for the method (training and evaluation),
        inside the seeded model-init RNG."""
        return model

    def personal_keys(self, model: nn.Module) -> set[str]:
        """The state-dict names that are personal (kept per client, never averaged)."""
        return module_keys(model, self.personal_modules)

    @property
    def personal(self) -> frozenset[str]:
        if self._personal is None:
            self._personal = frozenset(self.personal_keys(self.scratch_model_instance()))
        return self._personal

    # -- helpers -------------------------------------------------------------------------------
    def scratch_model_instance(self) -> nn.Module:
        if self._scratch is None:
            self._scratch = self.model_fn()
            fix_parameters(self._scratch)
            self._slots = self._scratch.state_dict(keep_vars=True)
            self._tied = repeated_names(self._slots)
        return self._scratch

    def scratch_model(self, weights: Weights) -> nn.Module:
        """A model holding copies of ``weights``: a reused working instance, given new tensors on each
        call (see :func:`load_weights`), so tensors taken from it earlier never change."""
        self.scratch_model_instance()
        self._held = load_weights(self._slots, weights)
        return self._scratch

    def scratch_weights(self) -> Weights:
        """The scratch model's weights, as ``clone(model.state_dict())`` but without the copy: the
        tensors the model trained in (after local training: the client's new weights), which the
        next :meth:`scratch_model` call leaves as they are. A tensor held under several names (tied
        weights) is copied for each further name."""
        weights = dict(self._held)
        for k in self._tied:
            weights[k] = weights[k].clone()
        return weights

    def model_of(self, weights: Weights) -> nn.Module:
        """A fresh model holding ``weights``."""
        model = self.model_fn()
        model.load_state_dict(weights)
        return model

    def average(self, updates: Sequence[ClientUpdate],
                items: Sequence[Weights] | None = None) -> Weights:
        """The ``fl.aggregation`` average of the updates' weights, or of ``items`` (one dict per
        update, e.g. an algorithm's extra tensors) with the same client coefficients."""
        if items is None:
            items = [u.weights for u in updates]
        return weighted_average(items, aggregation_coeffs(updates, self.aggregation))

    def local_weights(self, global_weights: Weights, client_state: ClientState) -> Weights:
        """The weights a client starts from: the global ones, with its personal entries (from its
        state; the global values before its first round)."""
        if not self.personal:
            return global_weights
        own = client_state.get("personal", {})
        return {k: own.get(k, v) if k in self.personal else v for k, v in global_weights.items()}

    def split_personal(self, weights: Weights) -> tuple[Weights, Weights]:
        """(shared, personal) entries of ``weights``."""
        shared = {k: v for k, v in weights.items() if k not in self.personal}
        return shared, {k: v for k, v in weights.items() if k in self.personal}


class ClientSide(Method):
    """The hooks that run on a client, in whichever executor (``fl.executor``): an executor calls
    these and nothing of :class:`ServerSide` or :class:`Evaluation`. Each is a function of its
    inputs; its only randomness is ``gen``, the client's stream of the round."""

    def init_client(self, client_id: int) -> ClientState:
        """A client's state before its first round (named groups of tensors the engine stores)."""
        return {}

    def probe(self, payload: Payload, client_state: ClientState, data: ClientData,
              gen: torch.Generator, client_id: int = 0) -> dict[str, float]:
        """Cheap information a candidate reports before selection: its mean task loss under the
        payload's model, over its local data (no training)."""
        model = self.scratch_model(self.local_weights(payload.weights, client_state))
        model.eval()
        total, count = 0.0, 0
        with torch.inference_mode():
            for batch in data.batches(max(len(data), 1), gen):
                total += float(self.task.loss(model, batch, gen)) * len(batch[0])
                count += len(batch[0])
        model.train()
        return {"loss": total / count if count else float("nan"), "num_samples": float(len(data))}

    def local_plan(self, payload: Payload, client_state: ClientState, data: ClientData,
                   client_id: int = 0) -> LocalPlan:
        """The client's local objective: by default plain local training from the global weights
        with its personal entries. FedProx adds its proximal term, SCAFFOLD its correction."""
        return LocalPlan(start=self.local_weights(payload.weights, client_state))

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        """One client's round: local training on :meth:`local_plan`'s objective, then
        :meth:`finish_update`. A method whose local step is more than that (Ditto's two models,
        FedRep's phases) overrides this, and is then trained by the serial executors only."""
        plan = self.local_plan(payload, client_state, data, client_id)
        model = self.scratch_model(plan.start)
        terms = plan.prox_centre is not None or plan.correction is not None or plan.grad_sum
        params = trainable(model) if terms else {}  # plain local training (FedAvg) needs none
        grad_sum = ({n: torch.zeros_like(p.detach()) for n, p in params.items()}
                    if plan.grad_sum else None)
        metrics = local_train(model, data, self.task, self.local, payload.round, gen,
                              loss_fn=proximal_loss(self.task, gen, params, plan.prox_mu,
                                                    plan.prox_centre),
                              grad_hook=corrected_grad_hook(params, plan.correction, grad_sum))
        return self.finish_update(plan, payload, client_state, data, client_id,
                                  self.scratch_weights(), metrics, grad_sum)

    def finish_update(self, plan: LocalPlan, payload: Payload, client_state: ClientState,
                      data: ClientData, client_id: int, weights: Weights,
                      metrics: dict[str, float], grad_sum: Weights | None
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        """``(update, client_state, metrics)`` from the client's trained ``weights`` (and its sum of
        raw gradients when the plan asked for it): the shared entries go up, the personal ones
        stay in the client's state."""
        if self.personal:
            weights, own = self.split_personal(weights)
            client_state = {**client_state, "personal": own}
        update = ClientUpdate(client_id, len(data), weights, metrics=metrics)
        return update, client_state, metrics


class ServerSide(Method):
    """The hooks that run on the server: the engine calls them between rounds' client work."""

    def init_server(self, model: nn.Module) -> ServerState:
        return ServerState(weights=clone(model.state_dict()))

    def training_clients(self, clients: Sequence[ClientData]) -> Sequence[ClientData]:
        """The data the round loop trains on: the clients themselves. Centralized training (a
        reference row) returns one pooled "client" holding every client's data; the engine then
        counts every client as a participant of every round. Evaluation always uses the clients."""
        return clients

    def select_clients(self, state: ServerState, round_: int, available: Sequence[int],
                       per_round: int, rng: np.random.Generator, probe: Probe | None = None
                       ) -> list[int]:
        """Uniform without replacement (seeded per round), sorted by id."""
        return uniform_selection(available, per_round, rng)

    def payload(self, state: ServerState, round_: int, client_id: int = 0) -> Payload:
        return Payload(round=round_, weights=state.weights, client_id=client_id)

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        """The average of the uploaded weights; entries nobody uploads (personal ones) keep the
        server's values."""
        if not rnd.updates or not rnd.updates[0].weights:
            return state
        avg = self.average(rnd.updates)
        weights = avg if len(avg) == len(state.weights) else {**state.weights, **avg}
        return ServerState(weights=weights, extra=state.extra, meta=state.meta)

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        return state

    def round_metrics(self, state: ServerState, rnd: RoundInfo) -> dict[str, float]:
        """Scalars of this round's server step, recorded in the round's history row after
        ``server_update`` (Equitable-FL: the NMI of its clustering). Default: none."""
        return {}


class Evaluation(Method):
    """The hooks the evaluation reads: which models a method has and how to build them."""

    @classmethod
    def has_global_model(cls) -> bool:
        """Whether the server's model is trained, so that the global model's metrics mean
        something: not for a method whose every module is personal (``personal_modules``
        holding ``""``: Local), whose server model stays the initial one. The pipeline then
        reports the global model's metrics as absent (docs/papers/baselines.md)."""
        return "" not in cls.personal_modules

    def global_model(self, state: ServerState) -> nn.Module:
        return self.model_of(state.weights)

    def personalized_model(self, state: ServerState, client_state: ClientState, data: ClientData,
                           gen: torch.Generator, client_id: int = 0) -> Weights | None:
        """Client ``client_id``'s own model weights for evaluation, or None (no personal models).
        Default: the global weights with the client's personal entries."""
        if not self.personal:
            return None
        return self.local_weights(state.weights, client_state)

    @property
    def personalizes(self) -> bool:
        """Whether clients have models of their own (then the engine evaluates them too): methods
        with personal entries, and methods that override :meth:`personalized_model`."""
        return (bool(self.personal)
                or type(self).personalized_model is not Evaluation.personalized_model)


class Strategy(ClientSide, ServerSide, Evaluation):
    """A federated method: FedAvg (McMahan et al. 2017) as it stands; other algorithms override the
    hooks they change, each in its group (:class:`ClientSide`, :class:`ServerSide`,
    :class:`Evaluation`)."""


GROUPS = {"client": ClientSide, "server": ServerSide, "evaluation": Evaluation}
"""Where hooks run, by the base class that holds them."""
DECLARATIONS = ("personal_modules", "default_backbone", "needs_client_groups", "server_data_kind",
                "check_clients", "adapt_model", "personal_keys")
"""What a method may declare to the pipeline (:class:`Method`), besides its name and config."""


def batches(cls: type) -> bool:
    """Whether ``fl.executor: batched`` may train method ``cls``: ``batchable``, declared on a class
    at or below the one whose ``client_update`` it runs (so a subclass with a client step of its own
    is not batched by inheritance)."""
    if not getattr(cls, "batchable", False):
        return False
    flag_owner = next(c for c in cls.__mro__ if "batchable" in vars(c))
    step_owner = next(c for c in cls.__mro__ if "client_update" in vars(c))
    return issubclass(flag_owner, step_owner)


def _overrides(cls: type, name: str) -> bool:
    owner = next(c for c in cls.__mro__ if name in vars(c))
    return owner not in (Method, ClientSide, ServerSide, Evaluation, Strategy)


def hook_groups(cls: type) -> dict[str, list[str]]:
    """The hooks method ``cls`` changes, by where they run (``client``, ``server``, ``evaluation``)
    and what it ``declared``, each in the base class's order."""
    out = {g: [k for k in vars(base) if not k.startswith("_") and _overrides(cls, k)]
           for g, base in GROUPS.items()}
    out["declared"] = [k for k in DECLARATIONS if _overrides(cls, k)]
    return out


def hook_table(methods: dict[str, type]) -> str:
    """A markdown table: per registered method, the hooks it changes in each group, and whether the
    batched executor may train it (``python -m fedpipe.algorithms`` prints it)."""
    rows = ["| method | on the client | on the server | at evaluation | declares | batched |",
            "|---|---|---|---|---|---|"]
    for name, cls in sorted(methods.items()):
        g = hook_groups(cls)
        cells = [", ".join(g[k]) for k in ("client", "server", "evaluation", "declared")]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if batches(cls) else ''} |")
    return "\n".join(rows) + "\n"


def require_server_data(rnd: RoundInfo, who: str, labelled: bool = False) -> ClientData:
    """The round's server data, or a ValueError saying what the method needs."""
    sd = rnd.server_data
    if sd is None:
        raise ValueError(f"{who} needs server data (its config's server_data); the pipeline "
                         f"passes it as run_federated(..., server_data=ServerData(...))")
    if len(sd.data) == 0:
        raise ValueError(f"{who}: the server data ({sd.kind}) is empty")
    if labelled and not sd.labelled:
        raise ValueError(f"{who}: the server data ({sd.kind}) is unlabelled but this task trains "
                         f"on labels; generate a labelled set (diffusion.conditional: true)")
    return sd.data


