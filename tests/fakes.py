"""Small stand-ins shared by the algorithm tests."""

import copy
import functools
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData

DT = torch.float64


class MSETask:
    """A regression task: mean squared error, so that one-step updates can be computed by hand."""

    name = "mse"

    def loss(self, model, batch, generator):
        x, y = batch
        return F.mse_loss(model(x), y)


def assert_identical(a, b):
    """Equal bit for bit: state dicts, or named groups of them."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_identical(a[k], b[k])
        else:
            assert torch.equal(a[k], b[k]), k


def with_changes(params: dict, **changes) -> dict:
    """A deep copy of ``params`` with ``"section/key/...": value`` changes applied; a missing
    ``algorithms.<name>`` section is made (params.yaml holds the default study's methods only)."""
    p = copy.deepcopy(params)
    for dotted, value in changes.items():
        node = p
        *head, last = dotted.split("/")
        for i, k in enumerate(head):
            if i == 1 and head[0] == "algorithms":
                node = node.setdefault(k, {})
            else:
                node = node[k]
        node[last] = value
    return p


# -- f(x) = h^T B x on float64 regression data: personal-FL steps computed by hand -----------------
class TwoLayer(nn.Module):
    """f(x) = h^T B x: a body B (2x2) and a head h (1x2), both without bias."""

    def __init__(self, body=((0.5, -0.2), (0.1, 0.3)), head=((0.4, -0.6),)):
        super().__init__()
        self.body = nn.Linear(2, 2, bias=False, dtype=DT)
        self.head = nn.Linear(2, 1, bias=False, dtype=DT)
        with torch.no_grad():
            self.body.weight.copy_(torch.tensor(body, dtype=DT))
            self.head.weight.copy_(torch.tensor(head, dtype=DT))

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


B0, H0 = TwoLayer().body.weight.detach().clone(), TwoLayer().head.weight.detach().clone()
"""TwoLayer's initial body and head."""


def regression_data(seed: int, n: int) -> ClientData:
    """``n`` samples x ~ N(0, I_2), y ~ N(0, 1) (float64) from the generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(n, 2, generator=g, dtype=DT), torch.randn(n, generator=g, dtype=DT))


def residual(B, h, d: ClientData):
    return (d.x @ B.T @ h.T).squeeze(-1) - d.y


def grad_head(B, h, d):  # d/dh mean (h^T B x - y)^2 = 2/n sum r (B x)^T
    return 2 / len(d) * (residual(B, h, d)[:, None] * (d.x @ B.T)).sum(0, keepdim=True)


def grad_body(B, h, d):  # d/dB = 2/n sum r h^T x^T
    return 2 / len(d) * (residual(B, h, d)[:, None, None] * h.T[None] * d.x[:, None, :]).sum(0)


LR = 0.1
FULL_BATCH = LocalTrainConfig(steps=1, batch_size=64, lr=LR)
"""One full-batch SGD step at LR: each client's update is one hand-computed gradient step."""
REGRESSION_CLIENTS = (regression_data(1, 3), regression_data(2, 5), regression_data(3, 4),
                      regression_data(4, 2))
"""Four clients' regression data (3, 5, 4 and 2 samples)."""


# -- a small classification run on the digits data set (8x8 images, 10 classes) ---------------------
def digits_clients(num_clients: int, per_client: int) -> list[ClientData]:
    """The first ``per_client`` training samples of each of ``num_clients`` IID clients of digits
    (partition seed 0)."""
    from fedpipe.config import dataset_config, partition_config
    from fedpipe.data import load_dataset, make_partition

    ds = load_dataset(dataset_config({"name": "digits"}))
    part = make_partition(ds.train.y.numpy(), ds.test.y.numpy(), 10,
                          partition_config({"scheme": "iid", "num_clients": num_clients}), 0)
    return [ClientData(ds.train.x[torch.from_numpy(i)][:per_client],
                       ds.train.y[torch.from_numpy(i)][:per_client]) for i in part.train]


def tiny_digits_model() -> nn.Module:
    """A linear classifier of digits (flattened 8x8 -> 10), weights N(0, 0.1^2) from seed 0."""
    g = torch.Generator().manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m


def two_layer_strategy(name: str, cfg=None, local: LocalTrainConfig = FULL_BATCH, *, model_fn=TwoLayer,
                       task=None, num_clients: int = 2, aggregation: str = "weighted"):
    """Algorithm ``name`` (its config from ``cfg``) on TwoLayer and MSETask by default."""
    from fedpipe.algorithms import ALGORITHMS, algorithm_config

    return ALGORITHMS[name](task or MSETask(), model_fn, local, algorithm_config(name, cfg),
                            aggregation=aggregation, num_clients=num_clients)


REPO = Path(__file__).resolve().parents[1]

STAND_IN_OUTPUTS = """
def write_outputs(stage, outs):
    \"\"\"A stand-in stage's declared outputs, named after the stage: a path with a suffix is a file
    holding the stage's name, any other a folder holding made_by.txt.\"\"\"
    for out in outs:
        path = Path(out)
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(stage + "\\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "made_by.txt").write_text(stage + "\\n")
"""
"""The output writer of the stand-in stage scripts (source text: the scripts run in a pipeline's
copy, where this module cannot be imported); a script that pastes it imports ``Path`` first."""


@functools.cache
def _composed_default() -> str:
    from fedpipe.pipeline.compose import compose_params

    with tempfile.TemporaryDirectory() as tmp:
        return compose_params(REPO, [], output=str(Path(tmp) / "params.yaml")).read_text()


def default_params() -> dict:
    """The default study's params as conf/ composes them (what `make params` commits), never the
    workspace's params.yaml: `dvc exp run` leaves its experiment's params.yaml in the workspace, and
    no test's verdict may depend on that. A fresh copy per call."""
    import yaml

    return yaml.safe_load(_composed_default())
