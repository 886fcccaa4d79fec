"""FedProx + power-of-choice client selection (Cho, Wang & Joshi, "Client Selection in Federated
Learning: Convergence Analysis and Power-of-Choice Selection Strategies", arXiv 2010.01243), the
"Fedprox + pow-d" baseline of Equitable-FL (§5.2).

Round k (``pi_pow-d``):

1. the server draws a candidate set A of d clients without replacement;
2. each candidate reports its local loss under the global model, F_i(w_k) (the engine's ``probe``:
   the mean task loss over its local training data, no training);
3. the server keeps the r candidates with the highest loss (ties broken by the lower client id);
4. they train with FedProx (eq. 2 of FedProx: ``F_i(w) + mu/2 ||w - w_k||^2``) and the server
   averages as FedProx does (``fl.aggregation``).

Choices where the papers are silent (config values):
- ``candidates`` = d, **inferred**. Equitable-FL does not give it (§5.2 names the baseline only),
  and Cho et al.'s paper is not in the project's library (re-checked; Flower's
  ``PowerOfChoice`` defaults to d = m, which is plain random selection). Cho et al. vary d as a
  multiple of the number of selected clients m; the default ``null`` = 2r takes the smallest multiple
  that makes the selection non-trivial (with Table 1's n = 10, r = 4: 8 candidates of 10).
- Cho et al. draw A with probability proportional to the data fractions p_i; here uniformly, since the
  server does not know the clients' sizes before it probes them (inferred; with Table 1's partitions
  the sizes differ only between groups).
- Cho et al. average the selected models uniformly (1/m); Equitable-FL calls the baseline "Fedprox +
  pow-d", so the FedProx average (``fl.aggregation``) is kept; ``fl.aggregation: uniform`` gives theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedpipe.algorithms.fedprox import FedProx, FedProxConfig
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check
from fedpipe.fl.strategy import Probe, ServerState, uniform_selection


@dataclass(frozen=True)
class PowDConfig(FedProxConfig):
    candidates: int | None = None
    """d, the size of the candidate set, in [r, N] (an error otherwise, checked before any data
    loads); null = 2r (all N clients when 2r >= N). Inferred: Equitable-FL does not give d,
    and Cho et al. is not in the library (see the module docstring)."""

    def validate(self, p: str) -> None:
        super().validate(p)
        if self.candidates is not None:
            check(self.candidates >= 1, f"{p}.candidates", self.candidates, "null or an integer >= 1")


def highest_loss(losses: dict[int, float], r: int) -> list[int]:
    """The ``r`` clients with the highest loss (ties: lower id first), sorted by id."""
    order = sorted(losses, key=lambda c: (-losses[c], c))
    return sorted(order[:r])


@register("pow_d")
class PowD(FedProx):
    tracks = ("classification",)  # not run or tested on the diffusion track (FedProx's is)
    config_class = PowDConfig

    @classmethod
    def check_clients(cls, cfg: PowDConfig, num_clients: int, per_round: int) -> None:
        """d must lie in [r, N]: fewer candidates than clients per round, or more than there are
        clients, is an error, never raised or clamped (d = r would make it uniform selection)."""
        if cfg.candidates is not None:
            check(per_round <= cfg.candidates <= num_clients, f"algorithms.{cls.name}.candidates",
                  cfg.candidates, f"null (2r, at most N) or an integer in [{per_round}, {num_clients}] "
                  f"(r = {per_round} clients per round of N = {num_clients})")

    def select_clients(self, state: ServerState, round_: int, available: Sequence[int],
                       per_round: int, rng: np.random.Generator, probe: Probe | None = None
                       ) -> list[int]:
        # d in [r, N] (check_clients); the default 2r draws all N clients when 2r >= N
        d = self.cfg.candidates if self.cfg.candidates is not None else 2 * per_round
        candidates = uniform_selection(available, d, rng)
        if probe is None or len(candidates) <= per_round:
            return candidates[:per_round] if probe is None else candidates
        reports = probe(candidates)
        return highest_loss({c: float(reports[c]["loss"]) for c in candidates}, per_round)
