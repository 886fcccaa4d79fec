"""Small stand-ins shared by the algorithm tests."""

import copy

import torch
import torch.nn.functional as F


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
    """A deep copy of ``params`` with ``"section/key/...": value`` changes applied."""
    p = copy.deepcopy(params)
    for dotted, value in changes.items():
        node = p
        *head, last = dotted.split("/")
        for k in head:
            node = node[k]
        node[last] = value
    return p
