"""FedDDPM and FedDDPM+ (Peng, Wang, Chen, Rao, Shen, "Federated Learning for Diffusion Models",
arXiv 2503.06426; Sections III-V): FedAvg plus server training on an auxiliary set A that the server
sampled, before federated training, from the clients' warm-up models (stages ``warmup`` and
``generate``).

FedDDPM (Algorithm 1). Round t, clients Z_t (n of them), client models w_{t+1}^i::

    w^_{t+1}      = w_t + sum_{i in Z_t} (1/n) (w_{t+1}^i - w_t)              # eq. 9: FedAvg
    w^_{t+1,0}    = w^_{t+1}
    w^_{t+1,e+1}  = w^_{t+1,e} - eta grad~f_A(w^_{t+1,e}),  e = 0..E-1       # server calibration on A
    w_{t+1}       = w^_{t+1,E}

FedDDPM+ (Algorithm 2) has no per-round server step. Every 10 rounds QuickTest (Algorithm 3) scores
the global model with an FID of 500 generated samples::

    QuickTest(w):   Score = FID(Sampling(w, TestSize))
                    if AvgScore != None and |AvgScore - Score| <= Threshold: return True
                    AvgScore = Score                                   if AvgScore == None
                             = gamma Score + (1 - gamma) AvgScore      otherwise
                    return False

When it returns True the server runs one correction of E epochs on A (Alg. 2 lines 7-9, with the
client lr zeta) and training stops.

``aux_only`` (:class:`AuxOnly`) is Table IV's reference row: the model trained on A alone, no client
taking part.

The calibration and the correction are :func:`fedpipe.fl.local.local_train` on A with the task's own
loss (the DDPM epsilon-MSE for a :class:`~fedpipe.tasks.DiffusionTask`): both algorithms are task-
agnostic. Aggregation (eq. 9) is the base :class:`~fedpipe.fl.Strategy`'s, i.e. ``fl.aggregation``:
the paper's unweighted 1/n mean is ``aggregation: uniform``, which the pipeline sets.

Server-side inputs come through the round protocol (:class:`~fedpipe.fl.strategy.RoundInfo`),
never through an untyped mapping:

- ``rnd.server_data``: A, the method's declared server data (``server_data: aux`` in its config;
  the pipeline loads the auxiliary set the diffusion track generated). A task that needs labels (a
  classifier, a class-conditional DDPM) refuses an unlabelled A;
- ``rnd.generator("server-update")``: the server's randomness (batch order, the loss's noise), the
  stream ``(seed, "server-update", round)``; QuickTest's sampling noise is ``(seed, "quicktest",
  round)``, never the global RNG;
- ``rnd.total`` (FedDDPM+): the total number of rounds ``fl.rounds`` (for the no-trigger correction);
- ``rnd.score`` (FedDDPM+): ``score(model, n, generator) -> float``, the FID of ``n`` samples drawn
  from ``model`` (a fresh model holding the global weights) with ``generator``.

A missing input is a ValueError naming it. ``state.meta`` (JSON, checkpointed with the run):

- ``"server_steps"``: cumulative server optimizer steps (both algorithms; for the cost
  comparison of Section VI-E3); ``"server_loss"``: the mean loss of the last server training;
- FedDDPM+: ``"quicktest"``, the trace, one ``{"round", "score", "ema_before", "fired"}`` per test
  (``round`` 1-based); ``"quicktest_ema"``, AvgScore after the last test (None before the first), from
  which a resumed run continues identically; ``"stopped_at"``, the 1-based round after which training
  stops (set when QuickTest fires; the engine then checkpoints that round and ends the run);
  ``"corrected_at"``, the 1-based round after which the correction ran.

Choices where the paper is ambiguous (docs/papers/fedddpm.md):

- Optimizer: the algorithms write SGD, but zeta = 2e-4 and eta = 5e-5 (VI-A2) are Adam learning rates
  (Ho et al.'s DDPM lr is Adam 2e-4; plain SGD at 5e-5 would barely move a DDPM), so the server
  optimizer is a config value, Adam by default, with a fresh state for every server training; no
  momentum or weight decay. The lr is constant. Gradient clipping follows ``fl.local.grad_clip``
  (the server trains the same model with the same loss as the clients).
- E counts epochs over A with batch ``server_batch_size`` (Section VI-A2: the experiments' meaning; the
  algorithm text counts single-sample steps). B = 128 is the paper's MNIST batch; CIFAR uses 64.
- FedDDPM+'s correction uses zeta (``correction_lr`` = 2e-4, the client lr) as Algorithm 2 prints,
  not FedDDPM's eta (its line 13).
- QuickTest period: the paper tests when ``t mod 10 == 0`` with 0-based t, i.e. literally after the
  1-based rounds 1, 11, 21, ... Its reported stop rounds (160, 150, ..., 330) are all multiples of 10,
  so this module tests after the 1-based rounds 10, 20, 30, ... (0-based r with
  ``(r + 1) % test_every == 0``): "every 10 rounds" of training, the first test after 10 rounds, and
  ``stopped_at`` is then a multiple of ``test_every`` like the paper's numbers. The first test only
  initialises the EMA, so the earliest stop is after round 2 * test_every.
- If QuickTest never fires (Algorithm 2 does not say): with ``correct_if_no_trigger`` (default) the
  correction runs after the last round (``rnd.total``), so FedDDPM+ always ends with one
  correction; ``stopped_at`` stays None (QuickTest did not stop training), ``corrected_at`` is set.
  When the last round is a test round, QuickTest runs first; a correction never runs twice.
- Once stopped or corrected, ``server_update`` does nothing (an engine that kept training would
  never get a second correction).
- Scaled-down studies (docs/papers/fedddpm.md): ``server_step_ratio`` / ``correction_step_ratio``
  keep the paper's ratio of server steps to a client's steps per round where |A| is far smaller
  than the paper's; ``relative_threshold`` expresses QuickTest's 0.2 (Inception-FID units) as a
  fraction of the FID level, for the LeNet-feature FID.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from torch import nn

from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.config.fl import OPTIMIZERS, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl.engine import DivergenceError
from fedpipe.fl.local import local_train
from fedpipe.fl.state import ServerState, Weights, clone
from fedpipe.fl.strategy import RoundInfo, Strategy, require_server_data

log = logging.getLogger(__name__)

QuickFID = Callable[[nn.Module, int, torch.Generator], float]


# -- configs -----------------------------------------------------------------------------------------
def check_ratio(key: str, ratio: float | None) -> None:
    if ratio is not None:
        check(ratio > 0, key, ratio, "null or a number > 0")


@dataclass(frozen=True)
class FedDDPMConfig:
    server_epochs: int = 1
    """E, the server's epochs over A per round (Alg. 1 lines 9-10): 1 for MNIST (paper), 5 for CIFAR."""
    server_lr: float = 5e-5
    """eta, the server lr in w^_{t+1,e+1} = w^_{t+1,e} - eta grad~f_A (Alg. 1 line 10; paper 5e-5)."""
    server_optimizer: str = "adam"
    """The paper writes SGD, but its lrs are Adam's (docs/papers/fedddpm.md): Adam by default (fresh
    state each round), ``sgd`` for the literal reading."""
    server_batch_size: int = 128
    """B of the server's minibatches of A: the paper's MNIST batch (inferred: the paper gives B for
    clients only; CIFAR uses 64)."""
    server_data: str = "aux"
    """The server data the calibration trains on: ``aux``, the auxiliary set A the server sampled
    from the clients' warm-up models (the paper's only choice)."""
    server_step_ratio: float | None = None
    """null: E = ``server_epochs`` epochs over A (the paper's setting). A number r: the server takes
    round(r x s) minibatch steps on A per round instead, s being the mean step count of the round's
    clients: the paper's balance of server calibration to client work, for a study whose |A| is far
    smaller than the paper's (:func:`ratio_steps`; docs/papers/fedddpm.md). Paper, Section VI-A:
    MNIST 47 / 15 = 3.13 (one epoch of 6,000 images at B = 128 against K = 3 epochs of 600), CIFAR
    395 / 40 = 9.88 (E = 5 epochs of 5,000 at B = 64 against K = 5 epochs of 500)."""

    def validate(self, p: str) -> None:
        one_of(f"{p}.server_data", self.server_data, ("aux",))
        check(self.server_epochs >= 1, f"{p}.server_epochs", self.server_epochs, "an integer >= 1")
        check_ratio(f"{p}.server_step_ratio", self.server_step_ratio)
        check(self.server_lr > 0, f"{p}.server_lr", self.server_lr, "a number > 0")
        one_of(f"{p}.server_optimizer", self.server_optimizer, OPTIMIZERS)
        check(self.server_batch_size >= 1, f"{p}.server_batch_size", self.server_batch_size,
              "an integer >= 1")


@dataclass(frozen=True)
class FedDDPMPlusConfig:
    test_every: int = 10
    """QuickTest period in rounds (Alg. 2 line 10, ``t mod 10 == 0``): after rounds 10, 20, ... (1-based;
    see the module docstring)."""
    test_size: int = 500
    """TestSize, the samples behind each QuickTest FID (Alg. 3 line 1; paper 500)."""
    gamma: float = 0.4
    """gamma, the EMA weight in AvgScore = gamma Score + (1 - gamma) AvgScore (Alg. 3 line 11; paper 0.4)."""
    threshold: float = 0.2
    """Threshold: QuickTest fires when |AvgScore - Score| <= Threshold (Alg. 3 line 3; paper 0.2, in
    Inception-FID units)."""
    relative_threshold: float | None = None
    """null: ``threshold`` is absolute, in the units of the FID in use (the paper's rule, for the
    Inception FID). A number f: QuickTest fires when |AvgScore - Score| <= f x AvgScore, the
    paper's 0.2 as a fraction of the FID level it was applied at, for an FID on another scale
    (docs/papers/fedddpm.md): 0.2 / 5.822 = 0.0344 (Table I, FedAvg, MNIST 15% Shard: the level of
    the FedAvg-trained model that QuickTest watches)."""
    correction_epochs: int = 20
    """E of the one-shot correction on A (Alg. 2 lines 8-9): 20 for MNIST (paper), 30 for CIFAR."""
    correction_lr: float = 2e-4
    """The correction's lr: Algorithm 2 writes zeta, the client lr (2e-4), not FedDDPM's eta."""
    correction_step_ratio: float | None = None
    """null: ``correction_epochs`` epochs over A (the paper's). A number r: round(r x s) steps, s
    being the mean step count of the last round's clients (as FedDDPM's ``server_step_ratio``).
    Paper: MNIST 20 x 47 / 15 = 62.7, CIFAR 30 x 79 / 40 = 59.3."""
    server_optimizer: str = "adam"
    """As FedDDPM's (the paper writes SGD; its lrs are Adam's, docs/papers/fedddpm.md)."""
    server_batch_size: int = 128
    """B of the correction's minibatches of A (inferred: the paper's MNIST client batch)."""
    correct_if_no_trigger: bool = True
    """Run the correction after the last round when QuickTest never fired (inferred; the paper does
    not say what happens then)."""
    server_data: str = "aux"
    """As FedDDPM's: the correction trains on the auxiliary set A."""

    def validate(self, p: str) -> None:
        one_of(f"{p}.server_data", self.server_data, ("aux",))
        check(self.test_every >= 1, f"{p}.test_every", self.test_every, "an integer >= 1")
        check(self.test_size >= 2, f"{p}.test_size", self.test_size, "an integer >= 2 (an FID needs 2)")
        check(0 < self.gamma <= 1, f"{p}.gamma", self.gamma, "a number in (0, 1]")
        check(self.threshold >= 0, f"{p}.threshold", self.threshold, "a number >= 0")
        if self.relative_threshold is not None:
            check(0 <= self.relative_threshold < 1, f"{p}.relative_threshold",
                  self.relative_threshold, "null or a number in [0, 1)")
        check_ratio(f"{p}.correction_step_ratio", self.correction_step_ratio)
        check(self.correction_epochs >= 1, f"{p}.correction_epochs", self.correction_epochs,
              "an integer >= 1")
        check(self.correction_lr > 0, f"{p}.correction_lr", self.correction_lr, "a number > 0")
        one_of(f"{p}.server_optimizer", self.server_optimizer, OPTIMIZERS)
        check(self.server_batch_size >= 1, f"{p}.server_batch_size", self.server_batch_size,
              "an integer >= 1")


# -- QuickTest (Algorithm 3) ---------------------------------------------------------------------------
class QuickTestEntry(NamedTuple):
    score: float
    ema_before: float | None
    fired: bool


class QuickTest:
    """Algorithm 3 on given scores: fires when |AvgScore - Score| <= threshold, AvgScore being the EMA
    *before* Score is added (the first call only initialises it; a firing call leaves it unchanged).
    With ``relative`` the threshold is ``threshold x AvgScore`` (the paper's absolute 0.2 as a
    fraction of the FID level, for an FID on another scale than the paper's Inception FID).

    ``ema`` is AvgScore (None before the first score): pass a saved value to continue a run. ``trace``
    lists this instance's calls as (score, ema_before, fired).
    """

    def __init__(self, gamma: float = 0.4, threshold: float = 0.2, ema: float | None = None,
                 relative: bool = False):
        self.gamma, self.threshold, self.relative = float(gamma), float(threshold), bool(relative)
        self.ema = None if ema is None else float(ema)
        self.trace: list[QuickTestEntry] = []

    def __call__(self, score: float) -> bool:
        score = float(score)
        if not math.isfinite(score):
            raise ValueError(f"QuickTest: the score must be finite, got {score}")
        before = self.ema
        fired = before is not None and abs(before - score) <= self.limit(before)  # line 3
        if not fired:
            self.ema = score if before is None else self.gamma * score + (1 - self.gamma) * before
        self.trace.append(QuickTestEntry(score, before, fired))
        return fired

    def limit(self, ema: float) -> float:
        """The largest |AvgScore - Score| at which the test fires, given AvgScore ``ema``."""
        return self.threshold * abs(ema) if self.relative else self.threshold


# -- the server step on A -----------------------------------------------------------------------------
def uses_labels(task: Any) -> bool:
    """Whether the task trains on labels (a classifier, a class-conditional DDPM)."""
    return getattr(task, "name", "") == "classification" or bool(getattr(task, "conditional", False))


def aux_of(strategy: Strategy, rnd: RoundInfo) -> ClientData:
    """A, the round's server data: non-empty, labelled when the task trains on labels."""
    return require_server_data(rnd, strategy.name, labelled=uses_labels(strategy.task))


def ratio_steps(ratio: float | None, rnd: RoundInfo) -> int | None:
    """round(``ratio`` x the mean optimizer-step count of the round's clients), at least 1; None
    when ``ratio`` is None (then the server counts epochs). The steps are the clients' own count
    (``metrics["steps"]``), so the ratio holds whatever the clients' sizes, batch and epochs."""
    if ratio is None:
        return None
    steps = [float(u.metrics["steps"]) for u in rnd.updates if "steps" in u.metrics]
    if not steps:
        raise ValueError(f"round {rnd.index + 1}: a server step ratio needs the clients' step "
                         "counts (metrics['steps'] of the round's updates); none came back")
    return max(1, round(ratio * sum(steps) / len(steps)))


def server_train(strategy: Strategy, weights: Weights, aux: ClientData, epochs: int, lr: float,
                 optimizer: str, batch_size: int, rnd: RoundInfo, steps: int | None = None
                 ) -> tuple[Weights, dict[str, float]]:
    """``epochs`` epochs (or exactly ``steps`` minibatch steps, A cycled, when given) of the task
    loss on A from ``weights`` (Alg. 1 lines 8-11, Alg. 2 lines 7-9): ``local_train`` with the
    ``(seed, "server-update", round)`` generator. Returns fresh weights (never tensors of
    ``weights``) and local_train's metrics; a non-finite loss is a DivergenceError."""
    cfg = LocalTrainConfig(epochs=epochs, steps=steps, batch_size=batch_size, optimizer=optimizer,
                           lr=lr, grad_clip=strategy.local.grad_clip)
    return train_on_aux(strategy, weights, aux, cfg, rnd)


def train_on_aux(strategy: Strategy, weights: Weights, aux: ClientData, cfg: LocalTrainConfig,
                 rnd: RoundInfo) -> tuple[Weights, dict[str, float]]:
    """``local_train`` with ``cfg`` on A from ``weights`` (see :func:`server_train`)."""
    model = strategy.scratch_model(weights)  # copies of the weights: the input is not trained
    metrics = local_train(model, aux, strategy.task, cfg, rnd.index, rnd.generator("server-update"))
    if not math.isfinite(metrics["loss"]):
        raise DivergenceError(f"diverged: round {rnd.index + 1}, {strategy.name} server training on the "
                              f"auxiliary set: non-finite loss ({metrics['loss']}); lower its lr")
    return strategy.scratch_weights(), metrics


def with_server_steps(meta: dict[str, Any], metrics: dict[str, float]) -> dict[str, Any]:
    """A new meta dict with the server's step count and loss added."""
    return {**meta, "server_steps": int(meta.get("server_steps", 0)) + int(metrics["steps"]),
            "server_loss": float(metrics["loss"])}


# -- the strategies ------------------------------------------------------------------------------------
@register("fedddpm")
class FedDDPM(Strategy):
    """Algorithm 1: FedAvg, then E epochs on A at lr eta after every aggregation."""
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only

    config_class = FedDDPMConfig
    batchable = True  # its client step is FedAvg's: fl.executor batched may run it

    def init_server(self, model: nn.Module) -> ServerState:
        return ServerState(weights=clone(model.state_dict()), meta={"server_steps": 0})

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        aux = aux_of(self, rnd)
        c = self.cfg
        weights, metrics = server_train(self, state.weights, aux, c.server_epochs, c.server_lr,
                                        c.server_optimizer, c.server_batch_size, rnd,
                                        ratio_steps(c.server_step_ratio, rnd))
        return ServerState(weights, state.extra, with_server_steps(state.meta, metrics))


@register("fedddpm_plus")
class FedDDPMPlus(Strategy):
    """Algorithms 2 and 3: FedAvg; QuickTest every ``test_every`` rounds; when it fires, one correction
    of ``correction_epochs`` epochs on A and the run stops (``meta["stopped_at"]``)."""
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only

    config_class = FedDDPMPlusConfig
    batchable = True  # its client step is FedAvg's: fl.executor batched may run it

    def init_server(self, model: nn.Module) -> ServerState:
        return ServerState(weights=clone(model.state_dict()),
                           meta={"server_steps": 0, "quicktest": [], "quicktest_ema": None,
                                 "stopped_at": None, "corrected_at": None})

    def is_test_round(self, round_: int) -> bool:
        """Whether QuickTest runs after 0-based round ``round_``: after the 1-based rounds test_every,
        2 test_every, ..."""
        return (round_ + 1) % self.cfg.test_every == 0

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        aux = aux_of(self, rnd)
        if rnd.score is None:
            raise ValueError(f"{self.name} needs the pipeline's model score for QuickTest: "
                             f"run_federated(..., score=score(model, n, generator) -> FID)")
        meta = state.meta
        if meta.get("stopped_at") is not None or meta.get("corrected_at") is not None:
            return state  # training is over: never a second correction
        c, round_ = self.cfg, rnd.index
        fired = False
        if self.is_test_round(round_):  # Alg. 2 line 10: QuickTest(w_{t+1})
            relative = c.relative_threshold is not None
            quick = QuickTest(c.gamma, c.relative_threshold if relative else c.threshold,
                              meta.get("quicktest_ema"), relative)
            score = rnd.score(self.global_model(state), c.test_size, rnd.generator("quicktest"))
            fired = quick(score)
            entry = quick.trace[-1]
            trace = [*meta.get("quicktest", []), {"round": round_ + 1, "score": entry.score,
                                                   "ema_before": entry.ema_before, "fired": fired}]
            meta = {**meta, "quicktest": trace, "quicktest_ema": quick.ema}
            log.info("QuickTest after round %d: FID %.4f, EMA before %s: %s", round_ + 1, entry.score,
                     "none" if entry.ema_before is None else f"{entry.ema_before:.4f}",
                     "fired" if fired else "continue")
        last = round_ + 1 >= rnd.total
        if not (fired or (last and c.correct_if_no_trigger)):
            return ServerState(state.weights, state.extra, meta) if meta is not state.meta else state
        # Alg. 2 lines 7-10: one correction on A at lr zeta, then stop
        log.info("%s: correction on the auxiliary set after round %d (%d epochs, %s)", self.name,
                 round_ + 1, c.correction_epochs, "QuickTest fired" if fired else "last round")
        weights, metrics = server_train(self, state.weights, aux, c.correction_epochs, c.correction_lr,
                                        c.server_optimizer, c.server_batch_size, rnd,
                                        ratio_steps(c.correction_step_ratio, rnd))
        meta = {**with_server_steps(meta, metrics), "corrected_at": round_ + 1}
        if fired:
            meta["stopped_at"] = round_ + 1
        return ServerState(weights, state.extra, meta)


@dataclass(frozen=True)
class AuxOnlyConfig:
    epochs: int = 1
    """Epochs over A per round (with ``fl.local``'s optimizer, lr, batch size and clipping)."""
    server_data: str = "aux"
    """The auxiliary set A, as FedDDPM's."""

    def validate(self, p: str) -> None:
        one_of(f"{p}.server_data", self.server_data, ("aux",))
        check(self.epochs >= 1, f"{p}.epochs", self.epochs, "an integer >= 1")


@register("aux_only")
class AuxOnly(Strategy):
    """Table IV's "training w/ aux. data": the model trained centrally on the auxiliary set A alone.
    No client trains (the round selects none); each round the server runs ``epochs`` epochs of the
    task loss on A with the clients' local settings (``fl.local``, lr decay included), from the
    current model, generator ``(seed, "server-update", round)``. The round count, evaluation and
    final FID are those of the study's other arms. ``meta["server_steps"]`` counts the steps."""
    tracks = ("classification", "diffusion")  # task-agnostic: the task's loss only

    config_class = AuxOnlyConfig

    def init_server(self, model: nn.Module) -> ServerState:
        return ServerState(weights=clone(model.state_dict()), meta={"server_steps": 0})

    def select_clients(self, state, round_, available, per_round, rng, probe=None) -> list[int]:
        return []  # the clients' data is never used

    def server_update(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        cfg = replace(self.local, epochs=self.cfg.epochs, steps=None)
        weights, metrics = train_on_aux(self, state.weights, aux_of(self, rnd), cfg, rnd)
        return ServerState(weights, state.extra, with_server_steps(state.meta, metrics))

    def round_metrics(self, state: ServerState, rnd: RoundInfo) -> dict[str, float]:
        return {"server_loss": float(state.meta["server_loss"])}
