"""Reference numbers of the papers, kept in the project so that reports can print them beside ours.

FedDDPM: Z. Peng, X. Wang, S. Chen, H. Rao, C. Shen, "Federated Learning for Diffusion Models",
arXiv 2503.06426 (2025), Tables I-III (FID, lower is better; 100 clients; Shard = 2 shards per
client, Dir = Dirichlet(alpha); 15% / 30% client participation), and the rounds at which FedDDPM+'s
QuickTest stopped training (Section VI-C; column order as in the tables, our inference: the text does
not name the columns).
"""

from __future__ import annotations

COLUMNS = ("15_shard", "15_dir0.1", "15_dir0.3", "30_shard", "30_dir0.1", "30_dir0.3")
COLUMN_TITLES = dict(zip(COLUMNS, ("15% Shard", "15% Dir 0.1", "15% Dir 0.3", "30% Shard",
                                   "30% Dir 0.1", "30% Dir 0.3"), strict=True))
CITATION = "Peng et al., Federated Learning for Diffusion Models, arXiv 2503.06426"

FEDDDPM_FID: dict[str, dict[str, tuple[float, ...]]] = {
    "mnist": {  # Table I
        "fedavg": (5.822, 4.448, 2.786, 4.868, 2.842, 2.377),
        "fedprox": (5.714, 4.331, 2.981, 4.651, 2.893, 2.343),
        "scaffold": (4.889, 3.876, 2.584, 4.237, 2.421, 2.150),
        "mofedsam": (4.840, 2.797, 2.358, 4.324, 2.983, 1.903),
        "fedddpm": (1.910, 2.151, 1.997, 1.842, 1.662, 1.768),
        "fedddpm_plus": (2.188, 2.037, 1.876, 1.865, 1.791, 1.762),
    },
    "cifar10": {  # Table II
        "fedavg": (39.326, 35.348, 28.686, 33.669, 32.886, 25.418),
        "fedprox": (36.019, 34.230, 29.167, 35.131, 33.118, 25.351),
        "scaffold": (29.659, 33.053, 28.616, 27.820, 30.561, 24.957),
        "mofedsam": (35.522, 31.045, 29.422, 28.626, 30.672, 23.852),
        "fedddpm": (22.296, 21.730, 18.089, 19.731, 18.817, 16.354),
        "fedddpm_plus": (21.508, 22.512, 20.531, 21.468, 20.753, 18.741),
    },
    "cifar100": {  # Table III
        "fedavg": (37.711, 30.281, 30.674, 37.829, 31.105, 28.667),
        "fedprox": (40.075, 32.732, 32.878, 38.426, 34.414, 32.580),
        "scaffold": (38.415, 31.862, 31.456, 37.154, 29.670, 30.161),
        "mofedsam": (37.646, 30.442, 28.719, 36.817, 28.502, 28.923),
        "fedddpm": (21.818, 23.416, 17.139, 19.096, 24.026, 20.196),
        "fedddpm_plus": (23.612, 22.007, 20.793, 22.996, 27.643, 24.554),
    },
}

FEDDDPM_PLUS_STOP_ROUND: dict[str, tuple[int, ...]] = {
    "mnist": (160, 150, 170, 130, 130, 120),  # of 400 rounds
    "cifar10": (280, 310, 320, 250, 270, 280),  # of 600
    "cifar100": (310, 330, 280, 290, 300, 270),  # of 600
}

TABLE_NAMES = {"mnist": "Table I (MNIST)", "cifar10": "Table II (CIFAR-10)",
               "cifar100": "Table III (CIFAR-100)"}


def parse_reference(key: str) -> tuple[str, str]:
    """``"mnist/15_shard"`` -> ("mnist", "15_shard"); ValueError listing what exists otherwise."""
    table, _, column = key.partition("/")
    if table not in FEDDDPM_FID or column not in COLUMNS:
        raise ValueError(f"unknown paper reference {key!r}; allowed: <{'|'.join(FEDDDPM_FID)}>/"
                         f"<{'|'.join(COLUMNS)}>")
    return table, column


def paper_fid(key: str) -> dict[str, float]:
    """The paper's FID per algorithm for the reference ``key`` (e.g. ``"mnist/15_shard"``)."""
    table, column = parse_reference(key)
    i = COLUMNS.index(column)
    return {algo: row[i] for algo, row in FEDDDPM_FID[table].items()}


def paper_stop_round(key: str) -> int:
    table, column = parse_reference(key)
    return FEDDDPM_PLUS_STOP_ROUND[table][COLUMNS.index(column)]


def describe(key: str) -> str:
    table, column = parse_reference(key)
    return f"{TABLE_NAMES[table]}, {COLUMN_TITLES[column]}"
