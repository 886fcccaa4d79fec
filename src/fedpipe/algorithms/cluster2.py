"""FedProx + clustered sampling from representative gradients (Fraboni, Vidal, Kameni & Lorenzi,
"Clustered Sampling: Low-Variance and Improved Representativity for Clients Selection in Federated
Learning", ICML 2021, Algorithm 2), the "Fedprox + Cluster2" baseline of Equitable-FL (§5.2).

Round k, r clients to select:

1. Every client i has a representative gradient g_i: its last update minus the global model it
   started from, ``w_i - w_k`` over the float entries of the state dict (zero before its first
   participation).
2. Similarity of clients: the angle between representative gradients,
   ``D_ij = arccos(cos(g_i, g_j))`` (Fraboni's ``arccos`` measure; pi/2 against a zero gradient).
3. Ward hierarchical clustering of D (scipy ``linkage(..., "ward")``), cut into r clusters
   (``fcluster(..., r, "maxclust")``).
4. One client is drawn from each cluster with probability proportional to its sample count N_i
   (known to the server from earlier rounds; 1 until then); if the cut gives fewer than r clusters,
   the rest are drawn uniformly from the unselected clients.
5. FedProx local training and the FedProx average (``fl.aggregation``).

Simplification (inferred; Equitable-FL §5.2 does not say): Fraboni's Algorithm 2 spreads the clients'
mass p_i over r distributions along the dendrogram so that every distribution holds mass 1/r; here
each cluster of the cut is one distribution (Ward hierarchical clustering into r groups, one client
sampled per group).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedpipe.algorithms.fedprox import FedProx
from fedpipe.algorithms.registry import register
from fedpipe.fl.state import is_float
from fedpipe.fl.strategy import Probe, RoundInfo, ServerState


def arccos_distances(grads: np.ndarray) -> np.ndarray:
    """D_ij = arccos(cos(g_i, g_j)); a zero gradient is at pi/2 from every other, 0 from itself."""
    g = np.asarray(grads, dtype=np.float64)
    norms = np.linalg.norm(g, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    cos = (g / safe[:, None]) @ (g / safe[:, None]).T
    cos[norms == 0, :] = 0.0
    cos[:, norms == 0] = 0.0
    d = np.arccos(np.clip(cos, -1.0, 1.0))
    np.fill_diagonal(d, 0.0)
    return d


def clustered_sample(distances: np.ndarray, sizes: np.ndarray, r: int,
                     rng: np.random.Generator) -> list[int]:
    """Ward clustering of ``distances`` cut into ``r`` clusters; one client per cluster with
    probability proportional to ``sizes``; fewer clusters than ``r``: the rest uniformly."""
    from scipy.cluster.hierarchy import fcluster, linkage  # lazy, as the other stages' imports
    from scipy.spatial.distance import squareform

    n = len(distances)
    if r >= n:
        return list(range(n))
    z = linkage(squareform(distances, checks=False), method="ward")
    labels = fcluster(z, t=r, criterion="maxclust")
    picked = []
    for lab in np.unique(labels):
        members = np.flatnonzero(labels == lab)
        p = sizes[members] / sizes[members].sum()
        picked.append(int(members[rng.choice(len(members), p=p)]))
    rest = [i for i in range(n) if i not in picked]
    if len(picked) < r:
        picked += [int(i) for i in rng.choice(rest, size=r - len(picked), replace=False)]
    return sorted(picked[:r])


def flat_update(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> torch.Tensor:
    """The update ``new - old`` as one vector, its parameters in sorted name order: a fixed order,
    so a vector kept in the server state (``extra.repgrad``) and one made after a resume (whose
    weights come back from the checkpoint in the file's sorted order) line up coordinate by
    coordinate."""
    return torch.cat([(new[k] - old[k]).flatten().float() for k in sorted(old) if is_float(old[k])])


@register("cluster2")
class Cluster2(FedProx):
    tracks = ("classification",)  # not run or tested on the diffusion track (FedProx's is)
    def select_clients(self, state: ServerState, round_: int, available: Sequence[int],
                       per_round: int, rng: np.random.Generator, probe: Probe | None = None
                       ) -> list[int]:
        grads_g = state.extra.get("repgrad", {})
        dim = sum(v.numel() for v in state.weights.values() if is_float(v))
        grads = np.stack([grads_g[str(c)].double().cpu().numpy() if str(c) in grads_g else np.zeros(dim)
                          for c in available])
        sizes_m = state.meta.get("cluster2_sizes", {})
        sizes = np.array([float(sizes_m.get(str(c), 1.0)) for c in available])
        chosen = clustered_sample(arccos_distances(grads), sizes, per_round, rng)
        return sorted(int(available[i]) for i in chosen)

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        new = super().aggregate(state, rnd)
        grads = {**state.extra.get("repgrad", {}),
                 **{str(u.client_id): flat_update(u.weights, state.weights) for u in rnd.updates}}
        sizes = {**state.meta.get("cluster2_sizes", {}),
                 **{str(u.client_id): float(u.num_samples) for u in rnd.updates}}
        return ServerState(weights=new.weights, extra={**new.extra, "repgrad": grads},
                           meta={**state.meta, "cluster2_sizes": sizes})
