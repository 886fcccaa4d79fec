"""The classification baselines' own headline claims, on the classification track (accuracy of the
final global model on the global test set, ``test_accuracy``; higher is better).

Each paper claims its method beats FedAvg on non-IID (heterogeneous) client data; the pipeline's
studies are such data, so the claim is checked on whatever partition the study uses. The papers do
not run our datasets or partitions, so ``source`` cites where each paper makes the claim, not a number
to compare with ours (no ``paper_values``: the paper's effect is unknown in our units, so a claim
not shown here is "undecided", never "smaller than the paper's"); ``quote`` is each abstract's
sentence. Later papers disagree in places (FedPTR's Table 1 has FedDC below
FedAvg on CIFAR-10 Dir(0.01)): that is why each claim is judged on the study's own seeds.

- SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
  ICML 2020: control variates correct client drift; Section 7's EMNIST experiments (logistic
  regression and a 2-layer network) show SCAFFOLD above FedAvg (and FedProx) under heterogeneity.
- FedDyn: Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021: Section 5
  (CIFAR-10/100, MNIST, EMNIST-L, Shakespeare; IID and Dirichlet splits) reports FedDyn reaching
  higher test accuracy than FedAvg, FedProx and SCAFFOLD in fewer rounds.
- FedDC: Gao et al., "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and
  Correction", CVPR 2022: Section 5 reports higher test accuracy than FedAvg, FedProx, SCAFFOLD and
  FedDyn on non-IID image classification.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedpipe.claims import Claim

if TYPE_CHECKING:
    from fedpipe.config.fl import StudyConfig

KEY = "baselines"
PAPER = "classification baselines"
ARMS = ("scaffold", "feddyn", "feddc")
ARM_TRACK = "classification"  # a study reports these papers when it classifies with their arms

SOURCES = {
    "scaffold": ("SCAFFOLD (Karimireddy et al. 2020)",
                 "ICML 2020, Section 7: EMNIST experiments under client heterogeneity"),
    "feddyn": ("FedDyn (Acar et al. 2021)",
               "ICLR 2021, Section 5: CIFAR-10/100, MNIST, EMNIST-L, Shakespeare (IID and Dirichlet)"),
    "feddc": ("FedDC (Gao et al. 2022)",
              "CVPR 2022, Section 5: non-IID image classification benchmarks"),
}
NAMES = {"scaffold": "SCAFFOLD", "feddyn": "FedDyn", "feddc": "FedDC"}
QUOTES = {  # each paper's abstract (the papers' texts are not in this project: not checked verbatim)
    "scaffold": ("We prove that SCAFFOLD requires significantly fewer communication rounds and is not "
                 "affected by data heterogeneity or client sampling."),
    "feddyn": ("We demonstrate both through empirical results on real and synthetic data as well as "
               "analytical results that our scheme leads to efficient training, in both convex and "
               "non-convex settings, while being fully agnostic to device heterogeneity and robust to "
               "large number of devices, partial participation and unbalanced data."),
    "feddc": ("The experiment results and analysis demonstrate that FedDC yields expediting "
              "convergence and better performance on various image classification tasks, robust in "
              "partial participation settings, non-iid data, and heterogeneous clients."),
}


def claims(study: StudyConfig) -> list[Claim]:
    """One claim per method: its global test accuracy is higher than FedAvg's (on any study)."""
    return [Claim(paper, f"{NAMES[method]} test accuracy > FedAvg test accuracy", "classification",
                  "test_accuracy", method, "fedavg", "higher", source, quote=QUOTES[method])
            for method, (paper, source) in SOURCES.items()]
