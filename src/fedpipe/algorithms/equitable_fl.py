"""Equitable-FL (Upadhyay & Hashemi, "Equitable Federated Learning with Activation Clustering",
arXiv 2410.19207; §4.2, Algorithm 1).

Round k, participants S_k (|S_k| = r, uniform without replacement):

1. Local training is FedProx (eq. 4): E local epochs of SGD on
   ``l(w) + mu/2 ||w - w_k||^2`` (:class:`~fedpipe.algorithms.fedprox.FedProx`).
2. Activation vector (Definition 1, Fig. 1): with its trained weights w_{k,E}^i, in eval mode, client
   i computes ``a_i = mean_{x in D_i} log_softmax(relu(h(x)))``, h the penultimate features (the
   input of the classification layer; ``Classifier.features``). The paper does not say how the
   per-sample vectors are reduced to one, nor which weights (Definition 1 says the local ones, the
   Introduction the global ones): the mean over the local training set with the local weights is
   our default (docs/papers/equitable_fl.md), and ``activation_model: global`` takes the received global model
   instead. The vector is uploaded beside the weights (``extra["activation"]``).
3. Server (Alg. 1 lines 13-25): ``A = [a_1; ...; a_r]``, ``S = A A^T`` (raw inner products, no
   normalisation); ``U`` = the eigenvectors of the C largest eigenvalues of S (``numpy.linalg.eigh``;
   no Laplacian, as Alg. 1 prints it); K-Means with C clusters on the rows of U (scikit-learn,
   k-means++, ``kmeans_n_init`` restarts, seeded from the round's stream ``(seed,
   "equitable-kmeans", k)``).
4. Equitable weights, eq. (6): ``p_k^i = 1 / (C |gamma(i)|)``, gamma(i) the cluster of i among the
   round's participants, so each cluster weighs 1/C whatever its size; sample counts play no role.
   p is renormalised to sum to 1 (it already does unless K-Means leaves a cluster empty). With
   r < C, K-Means forms r clusters (every client its own; docs/papers/equitable_fl.md).
5. Aggregation (Alg. 1 line 15): ``w_{k+1} = sum_i p_k^i w_{k,E}^i`` over every float entry of the
   state dict (BatchNorm statistics too; the paper does not say).

Per round the history records ``cluster_nmi``: the NMI of the clustering against the partition's
planted groups (Fig. 2; when the partition has them, ``label_blocks``), ``groups_present`` (planted
groups among the round's participants) and ``clusters_found``. In a round whose participants all
come from one group, K-Means still splits them into C clusters and the NMI is 0 by construction
(scikit-learn's convention); the evaluation reports the NMI over all rounds and over the rounds with
at least two groups present.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedpipe.algorithms.fedprox import FedProx, FedProxConfig
from fedpipe.algorithms.registry import register
from fedpipe.config.core import check, one_of
from fedpipe.data import ClientData
from fedpipe.fl.state import ClientUpdate, Payload, weighted_average
from fedpipe.fl.strategy import ClientState, RoundInfo, ServerState
from fedpipe.rng import numpy_rng

ACTIVATION_MODELS = ("local", "global")


@dataclass(frozen=True)
class EquitableFLConfig(FedProxConfig):
    mu: float = 0.001
    """FedProx mu (eq. 4). The paper tunes it over {0.001, 0.01, 0.1, 1}; 0.001 is the value its
    ablations (Tables 4-5, CIFAR-100) point to (docs/papers/equitable_fl.md). Studies set it per dataset."""
    num_clusters: int = 2
    """C, the number of clusters (eq. 6): an oracle hyperparameter, the planted number of groups
    (Table 1: 2 for MNIST / CIFAR-10, 3 for CIFAR-100, 5 for FEMNIST)."""
    activation_model: str = "local"
    """Weights the activation vector is computed with: ``local`` (w_{k,E}^i, Definition 1;
    default) or ``global`` (w_k, the Introduction's wording). The paper is inconsistent."""
    kmeans_n_init: int = 10
    """K-Means restarts (k-means++ init). Not given in the paper; inferred."""

    def validate(self, p: str) -> None:
        super().validate(p)
        check(self.num_clusters >= 1, f"{p}.num_clusters", self.num_clusters, "an integer >= 1")
        one_of(f"{p}.activation_model", self.activation_model, ACTIVATION_MODELS)
        check(self.kmeans_n_init >= 1, f"{p}.kmeans_n_init", self.kmeans_n_init, "an integer >= 1")


@torch.no_grad()
def activation_vector(model: torch.nn.Module, data: ClientData, gen: torch.Generator,
                      batch_size: int = 1024) -> torch.Tensor:
    """``mean_x log_softmax(relu(model.features(x)))`` over ``data`` in eval mode (Definition 1;
    the reduction by the mean is our default, docs/papers/equitable_fl.md). The model's train/eval
    mode is restored."""
    was_training = model.training
    model.eval()
    total, count = None, 0
    for x, _ in data.batches(batch_size, gen, shuffle=False):
        a = torch.log_softmax(torch.relu(model.features(x)), dim=1).double().sum(0)
        total = a if total is None else total + a
        count += len(x)
    model.train(was_training)
    return (total / max(count, 1)).float()


def spectral_clusters(activations: np.ndarray, num_clusters: int, rng: np.random.Generator,
                      n_init: int = 10) -> np.ndarray:
    """Alg. 1 ``getprobs`` lines 19-23: S = A A^T; the eigenvectors of the C largest eigenvalues;
    K-Means (C clusters) on their rows. Returns the cluster label of each row of ``activations``."""
    from sklearn.cluster import KMeans  # lazy: stages that never cluster skip importing sklearn

    a = np.asarray(activations, dtype=np.float64)
    c = min(num_clusters, len(a))
    s = a @ a.T
    _, vecs = np.linalg.eigh(s)  # ascending eigenvalues
    u = vecs[:, ::-1][:, :c]
    km = KMeans(n_clusters=c, n_init=n_init, random_state=int(rng.integers(2**31 - 1)))
    return km.fit_predict(u)


def equitable_weights(labels: np.ndarray, num_clusters: int) -> np.ndarray:
    """Eq. (6): p_i = 1 / (C |cluster(i)|), renormalised to sum to 1 (an empty cluster, or r < C)."""
    labels = np.asarray(labels)
    sizes = {lab: int((labels == lab).sum()) for lab in np.unique(labels)}
    p = np.array([1.0 / (num_clusters * sizes[lab]) for lab in labels])
    return p / p.sum()


@register("equitable_fl")
class EquitableFL(FedProx):
    tracks = ("classification",)  # not run or tested on the diffusion track (FedProx's is)
    config_class = EquitableFLConfig

    @classmethod
    def check_clients(cls, cfg: EquitableFLConfig, num_clients: int, per_round: int) -> None:
        """C clusters of a round's r participants need C <= r (else K-Means would be asked for
        fewer clusters than configured: an error, never a silent clamp)."""
        check(cfg.num_clusters <= per_round, f"algorithms.{cls.name}.num_clusters",
              cfg.num_clusters, f"an integer in [1, {per_round}] (r = {per_round} clients per "
              "round are clustered)")

    def client_update(self, payload: Payload, client_state: ClientState, data: ClientData,
                      gen: torch.Generator, client_id: int = 0
                      ) -> tuple[ClientUpdate, ClientState, dict[str, float]]:
        if self.cfg.activation_model == "global":
            a = activation_vector(self.scratch_model(payload.weights), data, gen)
        update, client_state, metrics = super().client_update(payload, client_state, data, gen,
                                                              client_id)
        if self.cfg.activation_model == "local":  # the scratch model holds w_{k,E}^i
            a = activation_vector(self._scratch, data, gen)
        update.extra = {**update.extra, "activation": {"a": a}}
        return update, client_state, metrics

    def cluster(self, rnd: RoundInfo) -> np.ndarray:
        acts = np.stack([u.extra["activation"]["a"].double().cpu().numpy() for u in rnd.updates])
        rng = numpy_rng(rnd.seed, "equitable-kmeans", rnd.index)
        return spectral_clusters(acts, self.cfg.num_clusters, rng, self.cfg.kmeans_n_init)

    def aggregate(self, state: ServerState, rnd: RoundInfo) -> ServerState:
        labels = self.cluster(rnd)
        p = equitable_weights(labels, self.cfg.num_clusters)
        weights = weighted_average([u.weights for u in rnd.updates], p.tolist())
        clusters = {str(u.client_id): int(lab) for u, lab in zip(rnd.updates, labels, strict=True)}
        return ServerState(weights=weights, extra=state.extra,
                           meta={**state.meta, "clusters": clusters})

    def round_metrics(self, state: ServerState, rnd: RoundInfo) -> dict[str, float]:
        clusters = state.meta.get("clusters", {})
        out = {"clusters_found": float(len(set(clusters.values())))}
        if self.client_groups is not None and clusters:
            from sklearn.metrics import normalized_mutual_info_score

            ids = sorted(clusters, key=int)
            true = [self.client_groups[int(c)] for c in ids]
            # = fedpipe.metrics.clustering_nmi (the metrics layer sits below the algorithms)
            out["cluster_nmi"] = float(normalized_mutual_info_score(true, [clusters[c] for c in ids]))
            out["groups_present"] = float(len(set(true)))
        return out
