"""Centralized training, the reference row of Equitable-FL's Tables 2-3 (Upadhyay & Hashemi, arXiv
2410.19207, §5 "Baselines": "The training happens in a centralized fashion, where all the clients
share their data with the server"; Table 2's caption: "just for reference").

The round loop trains one "client" that holds the union of every client's training data: each round
it runs ``fl.local`` (E epochs of plain SGD, the study's batch size and lr) on the pooled data from the
current model, and that model is the new global model (one update: the average is the update itself,
bit for bit). K rounds are therefore K * E epochs over all the data, where a federated method with r of
n clients per round passes over about r / n of it per round.

Choices where the paper is silent (inferred):
- the same K, E, batch size and lr as the federated methods (the paper gives it no settings of
  its own); the local objective is the plain task loss (§5.2 names FedProx with every baseline but
  Centralized and GIFAIR, so no mu);
- evaluation is the federated methods' (the global model on the global test set and on every
  client's local test split), so σ_Acc is comparable; for the client disagreement CD (eq. 9) every
  client counts as a participant of every round, since every client's data is used, so CD is over
  all n clients (the paper gives no CD for this row);
- a client's feature skew (rotation, noise) stays attached to its samples in the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedpipe.algorithms.registry import register
from fedpipe.data import ClientData
from fedpipe.data.skew import apply_feature_skew
from fedpipe.fl.strategy import Strategy


@dataclass(frozen=True)
class PooledData(ClientData):
    """Several clients' data as one: ``owner`` gives each row's client (0..k-1 in ``skews``' order),
    whose feature skew is applied to its rows of a batch."""

    owner: torch.Tensor = field(
        default_factory=lambda: torch.empty(0, dtype=torch.long, device="cpu"))
    skews: tuple[tuple[str, float], ...] = ()

    def batch(self, idx: torch.Tensor, generator: torch.Generator | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        x, owner = self.x[idx].clone(), self.owner[idx]
        for k, skew in enumerate(self.skews):
            rows = owner == k
            if rows.any():
                x[rows] = apply_feature_skew(x[rows], *skew, generator=generator)
        return x, self.y[idx]


def pool(clients: Sequence[ClientData]) -> ClientData:
    """The union of ``clients``' data, rows in client order. A plain :class:`ClientData` when the
    clients share one feature skew (or have none), a :class:`PooledData` otherwise."""
    x = torch.cat([c.x for c in clients])
    y = torch.cat([c.y for c in clients])
    skews = tuple(c.skew for c in clients)
    if len(set(skews)) == 1:
        return ClientData(x, y, skews[0])
    owner = torch.cat([torch.full((len(c),), k, dtype=torch.long, device=x.device)
                       for k, c in enumerate(clients)])
    return PooledData(x, y, owner=owner, skews=skews)


@register("centralized")
class Centralized(Strategy):
    def training_clients(self, clients: Sequence[ClientData]) -> Sequence[ClientData]:
        return [pool(clients)]
