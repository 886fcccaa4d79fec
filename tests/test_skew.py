import numpy as np
import torch

from fedpipe.config import partition_config
from fedpipe.data import Split, apply_feature_skew, client_data, make_partition
from fedpipe.rng import torch_generator


def test_rotation_by_right_angle_is_exact():
    x = torch.arange(2 * 1 * 3 * 3, dtype=torch.float32).reshape(2, 1, 3, 3)
    r = apply_feature_skew(x, "rotation", 90.0)
    assert torch.equal(r, torch.rot90(x, 1, dims=(-2, -1)))
    assert torch.equal(apply_feature_skew(x, "rotation", 360.0), x)
    # a 4 x 90 degrees rotation is the identity
    y = x
    for _ in range(4):
        y = apply_feature_skew(y, "rotation", 90.0)
    assert torch.equal(y, x)


def test_rotation_other_angle_keeps_centre_pixel():
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 2, 2] = 1.0
    r = apply_feature_skew(x, "rotation", 45.0)
    assert r.shape == x.shape and r[0, 0, 2, 2] > 0.9


def test_noise_seeded_and_scaled():
    x = torch.full((200, 1, 8, 8), 0.5)
    a = apply_feature_skew(x, "noise", 0.1, torch_generator(0, "noise", 1))
    b = apply_feature_skew(x, "noise", 0.1, torch_generator(0, "noise", 1))
    assert torch.equal(a, b)
    assert abs(float((a - x).std()) - 0.1) < 0.01
    assert torch.equal(apply_feature_skew(x, "noise", 0.0, None), x)


def test_client_data_applies_partition_skew():
    y = np.repeat(np.arange(2), 10)
    x = torch.rand(20, 1, 4, 4)
    split = Split(x, torch.from_numpy(y))
    cfg = partition_config({"scheme": "iid", "num_clients": 2, "feature_skew": "rotation",
                            "feature_skew_values": [0.0, 180.0]})
    part = make_partition(y, y, 2, cfg, 0)
    c1 = client_data(split, part, 1)
    assert c1.skew == ("rotation", 180.0)
    idx = torch.arange(len(c1))
    bx, by = c1.batch(idx)
    expected = torch.rot90(x[torch.from_numpy(part.train[1])], 2, dims=(-2, -1))
    assert torch.equal(bx, expected) and torch.equal(by, split.y[torch.from_numpy(part.train[1])])
    batches = list(c1.batches(4, torch_generator(0, "b")))
    assert sum(len(b[1]) for b in batches) == len(c1)
