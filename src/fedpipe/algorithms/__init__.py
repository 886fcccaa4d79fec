"""Algorithms: one module per method family, each a :class:`fedpipe.fl.Strategy`.

``ALGORITHMS`` maps the name used in params (``algorithms.<name>``, ``study.algorithms``) to the
Strategy class; each class's ``config_class`` is its hyperparameter dataclass. Every section may also
say where the method's model starts (``backbone``, ``pretrain_rounds``: :func:`init_config`), which
the pipeline honours for every algorithm; the algorithm's config never sees those keys.
"""

from __future__ import annotations

from typing import Any

from fedpipe.algorithms.apfl import APFL
from fedpipe.algorithms.centralized import Centralized
from fedpipe.algorithms.cluster2 import Cluster2
from fedpipe.algorithms.creff import CReFF
from fedpipe.algorithms.ditto import Ditto
from fedpipe.algorithms.equitable_fl import EquitableFL
from fedpipe.algorithms.fairfed import FairFed
from fedpipe.algorithms.fedavg import FedAvg
from fedpipe.algorithms.fedavg_ft import FedAvgFT
from fedpipe.algorithms.fedbabu import FedBABU
from fedpipe.algorithms.fedbn import FedBN
from fedpipe.algorithms.feddc import FedDC
from fedpipe.algorithms.fedddpm import AuxOnly, FedDDPM, FedDDPMPlus
from fedpipe.algorithms.feddf import FedDF
from fedpipe.algorithms.feddyn import FedDyn
from fedpipe.algorithms.fednh import FedNH
from fedpipe.algorithms.fedper import FedPer
from fedpipe.algorithms.fedproto import FedProto
from fedpipe.algorithms.fedprox import FedProx
from fedpipe.algorithms.fedptr import FedPTR, FedPTRFixed, FedPTRNoProj, FedPTRS, FedPTRSOnce
from fedpipe.algorithms.fedrep import FedRep
from fedpipe.algorithms.fedrod import FedRoD
from fedpipe.algorithms.fedsim import FedAlt, FedSim
from fedpipe.algorithms.gifair import GIFAIR
from fedpipe.algorithms.lg_fedavg import LGFedAvg
from fedpipe.algorithms.local import Local
from fedpipe.algorithms.mofedsam import MoFedSAM
from fedpipe.algorithms.perada import PerAda, PerAdaNoKD
from fedpipe.algorithms.pfedme import PFedMe
from fedpipe.algorithms.pow_d import PowD
from fedpipe.algorithms.scaffold import Scaffold
from fedpipe.config import ConfigError, build
from fedpipe.config.fl import INIT_KEYS, InitConfig
from fedpipe.fl import Strategy

ALGORITHMS: dict[str, type[Strategy]] = {
    "fedavg": FedAvg,  # the base Strategy, with FedNH's latest-local-model PM as an option
    "fedprox": FedProx,
    "scaffold": Scaffold,
    "feddyn": FedDyn,
    "feddc": FedDC,
    "mofedsam": MoFedSAM,
    "fedddpm": FedDDPM,
    "fedddpm_plus": FedDDPMPlus,
    "aux_only": AuxOnly,  # FedDDPM's Table IV: training on the auxiliary set alone
    "local": Local,
    "fedavg_ft": FedAvgFT,
    "fedper": FedPer,
    "fedrep": FedRep,
    "ditto": Ditto,
    "fedbn": FedBN,
    "lg_fedavg": LGFedAvg,
    "apfl": APFL,
    "pfedme": PFedMe,
    "fedrod": FedRoD,
    "fedsim": FedSim,
    "fedalt": FedAlt,
    "creff": CReFF,
    "fedptr": FedPTR,
    "fedptr_s": FedPTRS,
    "fedptr_s_once": FedPTRSOnce,
    "fedptr_fixed": FedPTRFixed,  # Table 4's fixed lambda
    "fedptr_noproj": FedPTRNoProj,  # control: the layer-adaptive pull aimed at w^t
    # Equitable-FL (Upadhyay & Hashemi, arXiv 2410.19207) and its baselines
    "equitable_fl": EquitableFL,
    "cluster2": Cluster2,
    "pow_d": PowD,
    "gifair": GIFAIR,
    "fairfed": FairFed,
    "centralized": Centralized,
    "fednh": FedNH,
    "fedbabu": FedBABU,
    "fedproto": FedProto,
    "perada": PerAda,
    "perada_nokd": PerAdaNoKD,
    "feddf": FedDF,
}


def check_algorithms(names: list[str] | tuple[str, ...], key: str) -> None:
    """Every name of ``names`` (the value of param ``key``) is a registered algorithm. (Only
    registry names reach a stage's name, dvc.yaml's paths, or anything else.)"""
    for i, name in enumerate(names):
        if name not in ALGORITHMS:
            raise ConfigError(f"{key}[{i}]", name, "one of " + ", ".join(sorted(ALGORITHMS)))


def algorithm_config(name: str, data: dict[str, Any] | None, key: str = "algorithm argument") -> Any:
    """Validate ``algorithms.<name>`` against the algorithm's config dataclass (``key`` names where
    ``name`` came from, for the error line); its init keys (:func:`init_config`) are validated and
    left out."""
    init_config(name, data, key)  # the section's init keys are valid too
    own = {k: v for k, v in data.items() if k not in INIT_KEYS} if isinstance(data, dict) else data
    return build(ALGORITHMS[name].config_class, own, f"algorithms.{name}")


def init_config(name: str, data: dict[str, Any] | None, key: str = "algorithm argument"
                ) -> InitConfig:
    """Where algorithm ``name``'s model starts: the ``backbone`` / ``pretrain_rounds`` keys of
    ``algorithms.<name>``, by default the algorithm's ``default_backbone`` (``none``; PerAda's frozen
    backbone: ``fedavg``)."""
    if name not in ALGORITHMS:
        raise ConfigError(key, name, "one of " + ", ".join(sorted(ALGORITHMS)))
    given = {k: v for k, v in data.items() if k in INIT_KEYS} if isinstance(data, dict) else {}
    return build(InitConfig, {"backbone": ALGORITHMS[name].default_backbone, **given},
                 f"algorithms.{name}")


def check_algorithm_sections(data: Any) -> dict[str, Any]:
    """The ``algorithms`` section: a mapping from registered names to mappings, each valid for its
    algorithm (all are checked, not only the study's: a typo in any is an error). Returns it."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("algorithms", data, "a mapping of algorithm name to its settings")
    for name, cfg in data.items():
        if name not in ALGORITHMS:
            raise ConfigError(f"algorithms.{name}", cfg,
                              "a registered algorithm name: " + ", ".join(sorted(ALGORITHMS)))
        if cfg is not None and not isinstance(cfg, dict):
            raise ConfigError(f"algorithms.{name}", cfg, "a mapping of settings ({} for the defaults)")
        algorithm_config(name, cfg)
    return data
