import numpy as np
import torch

from fedpipe.rng import numpy_rng, torch_generator, torch_seed


def test_same_stream_same_draws():
    a = numpy_rng(3, "partition").random(5)
    b = numpy_rng(3, "partition").random(5)
    assert np.array_equal(a, b)


def test_streams_differ_by_seed_purpose_and_keys():
    base = numpy_rng(3, "client", 1, 2).random(4)
    assert not np.array_equal(base, numpy_rng(4, "client", 1, 2).random(4))
    assert not np.array_equal(base, numpy_rng(3, "server", 1, 2).random(4))
    assert not np.array_equal(base, numpy_rng(3, "client", 2, 1).random(4))
    assert not np.array_equal(base, numpy_rng(3, "client", 1, 3).random(4))


def test_torch_generator_reproducible_and_in_range():
    s = torch_seed(0, "x", 5)
    assert 0 <= s < 2**63
    a = torch.randn(3, generator=torch_generator(0, "x", 5))
    b = torch.randn(3, generator=torch_generator(0, "x", 5))
    c = torch.randn(3, generator=torch_generator(0, "x", 6))
    assert torch.equal(a, b) and not torch.equal(a, c)
