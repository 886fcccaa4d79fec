"""FedNH's prototype head (Dai et al., "Tackling Data Heterogeneity in Federated Learning with Class
Prototypes", AAAI 2023; §3.2, Eqs. 1-2) and FedProto's nearest-prototype head.

:class:`PrototypeHead` replaces a classifier's linear head by C unit-norm class prototypes W (rows,
no bias) and a scale s:

    logits_c(x) = s * <W_c, f(x) / ||f(x)||>            (Eq. 2: s times a cosine similarity)

W is a frozen parameter (``requires_grad=False``: no optimizer ever updates it; the FedNH server
moves it without gradients), s a trainable one (the official code's ``nn.Parameter``, averaged with
the body). The initialisation (``init``):

- ``orthogonal`` (official code, the default): ``torch.nn.init.orthogonal_`` rows, orthonormal when
  C <= d: unit norm, pairwise cosine 0 (M^2 = 2 in Eq. 1);
- ``etf``: the simplex equiangular tight frame, the exact optimum of Eq. 1 when d >= C:
  W = sqrt(C / (C-1)) (I - 11^T / C) U^T with U (d x C) orthonormal columns (QR of a Gaussian);
  pairwise cosine -1/(C-1), M^2 = 2C/(C-1).

Random draws use torch's global RNG, which the pipeline seeds from the stream (seed, "model-init")
for every model it builds (``pipeline.common.make_model``), so every client and the server get the
same prototypes (the official code reseeds for the same reason).

:class:`DistanceHead` is FedProto's inference rule (as in FedNH's FedProto code): the class
whose global prototype p_c is nearest, logits_c = -||f(x) - p_c||^2, beside an ordinary linear head
(``linear``) that local training fits with cross-entropy.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PROTOTYPE_INITS = ("orthogonal", "etf")


def orthogonal_prototypes(num_classes: int, dim: int) -> torch.Tensor:
    """(C, d) rows from ``torch.nn.init.orthogonal_`` (the official code), renormalised to unit norm
    (they already are when C <= d; for C > d the rows are not orthogonal and are only rescaled)."""
    w = torch.nn.init.orthogonal_(torch.empty(num_classes, dim, device="cpu"))  # built on the CPU
    return F.normalize(w, dim=1)


def etf_prototypes(num_classes: int, dim: int) -> torch.Tensor:
    """(C, d) simplex ETF: unit rows with pairwise inner product -1/(C-1) (needs d >= C)."""
    c = num_classes
    if c < 2:
        raise ValueError(f"a simplex ETF needs at least 2 classes, got {c}")
    if dim < c:
        raise ValueError(f"a simplex ETF of {c} classes needs feature dimension >= {c}, got {dim}; "
                         "use init 'orthogonal'")
    u, _ = torch.linalg.qr(torch.randn(dim, c, device="cpu"))  # (d, C) orthonormal columns
    centre = torch.eye(c, device="cpu") - torch.full((c, c), 1.0 / c, device="cpu")
    return math.sqrt(c / (c - 1)) * centre @ u.T


class PrototypeHead(nn.Module):
    """logits = s * normalize(z) @ W^T with W (C, d) unit-norm frozen rows and a trainable scale s."""

    def __init__(self, feature_dim: int, num_classes: int, init: str = "orthogonal",
                 scale: float = 1.0) -> None:
        super().__init__()
        if init not in PROTOTYPE_INITS:
            raise ValueError(f"prototype init {init!r} is not allowed; allowed: {PROTOTYPE_INITS}")
        make = orthogonal_prototypes if init == "orthogonal" else etf_prototypes
        self.weight = nn.Parameter(make(num_classes, feature_dim), requires_grad=False)
        self.scale = nn.Parameter(torch.tensor(float(scale), device="cpu"))

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        # F.normalize: z / max(||z||, 1e-12), as the official code
        return self.scale * F.normalize(z, dim=1) @ self.weight.T


class DistanceHead(nn.Module):
    """FedProto: ``forward`` = -||z - p_c||^2 to the (global) prototypes ``prototypes`` (C, d), a
    frozen parameter set by the strategy; ``linear`` is the trained linear classifier (out_g)."""

    def __init__(self, linear: nn.Linear, prototypes: torch.Tensor) -> None:
        super().__init__()
        self.linear = linear
        self.prototypes = nn.Parameter(prototypes.clone(), requires_grad=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return -torch.cdist(z, self.prototypes).pow(2)


def with_prototype_head(model: nn.Module, init: str = "orthogonal", scale: float = 1.0
                        ) -> nn.Module:
    """``model`` (a :class:`~fedpipe.models.classifiers.Classifier`: ``head(features(x))``) with its
    head replaced by a :class:`PrototypeHead` of the same width (in place; returned)."""
    head = model.head
    model.head = PrototypeHead(head.in_features, head.out_features, init, scale)
    return model


def with_distance_head(model: nn.Module) -> nn.Module:
    """``model`` with its linear head wrapped in a :class:`DistanceHead` whose prototypes start as
    U[0, 1) draws (FedProto code: ``torch.rand(dim)`` per class before any client reports)."""
    head = model.head
    model.head = DistanceHead(head, torch.rand(head.out_features, head.in_features,
                                                device=head.weight.device))
    return model
