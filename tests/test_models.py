import pytest
import torch
from torch import nn

from fedpipe.models import MODELS, build_model

SHAPES = [(1, 8, 8), (3, 32, 32)]
SMALL = {"convnet": {"width": 16}}  # keep the test fast; the architecture is the same


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_and_head_split(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, 7, **SMALL.get(name, {}))
    x = torch.rand(2, *shape)
    model.eval()
    with torch.no_grad():
        feats = model.features(x)
        out = model(x)
    assert out.shape == (2, 7)
    assert feats.shape == (2, model.feature_dim)
    assert isinstance(model.head, nn.Linear)
    assert model.head.in_features == model.feature_dim
    torch.testing.assert_close(out, model.head(feats), rtol=0, atol=0)
    assert all(k.startswith(("body.", "head.")) for k in model.state_dict())


@pytest.mark.parametrize(("name", "dim"), [("mlp", 200), ("lenet", 84), ("cnn_fednh", 192),
                                           ("convnet", 2048), ("resnet18", 512)])
def test_feature_dims(name: str, dim: int) -> None:
    assert build_model(name, (3, 32, 32), 10).feature_dim == dim


def test_mnist_shapes() -> None:
    assert build_model("convnet", (1, 28, 28), 10, width=8).feature_dim == 8 * 4 * 4  # MTT pad 3
    lenet = build_model("lenet", (1, 28, 28), 10)  # unpadded: 28 -> 24 -> 12 -> 8 -> 4
    assert lenet.body[1].in_features == 16 * 4 * 4


def test_paper_parameter_counts() -> None:
    n_mlp = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    assert n_mlp == 199210
    assert _n_params(build_model("mlp", (1, 28, 28), 10)) == n_mlp
    assert _n_params(build_model("lenet", (3, 32, 32), 10)) == 62006  # PyTorch-tutorial LeNet
    fednh = build_model("cnn_fednh", (3, 32, 32), 10)  # FedNH Listing 1, bias-free head
    assert fednh.head.bias is None
    assert _n_params(fednh) == 4864 + 102464 + 1600 * 384 + 384 + 384 * 192 + 192 + 1920
    assert _n_params(build_model("convnet", (3, 32, 32), 10)) == 320010  # FedPTR §5.1's (MTT's) ConvNet


def test_resnet18_is_cifar_style_and_group_norm() -> None:
    net = build_model("resnet18", (1, 8, 8), 5, norm="group")
    assert net.body.conv1.kernel_size == (3, 3) and net.body.conv1.stride == (1, 1)
    assert net.body.conv1.in_channels == 1
    assert isinstance(net.body.maxpool, nn.Identity)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert sum(isinstance(m, nn.GroupNorm) and m.num_groups == 2 for m in net.modules()) > 0
    assert [n for n, _ in net.named_buffers()] == ["normalize.mean", "normalize.std"]
    with pytest.raises(ValueError, match="allowed"):
        build_model("resnet18", (3, 32, 32), 10, norm="layer")


def test_construction_leaves_batchnorm_stats_untouched() -> None:
    net = build_model("resnet18", (3, 32, 32), 10)
    assert net.training
    bn = net.body.bn1
    assert int(bn.num_batches_tracked) == 0
    torch.testing.assert_close(bn.running_var, torch.ones_like(bn.running_var))


def test_unknown_name_and_option() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg'") as e:
        build_model("vgg", (3, 32, 32), 10)
    assert all(n in str(e.value) for n in MODELS)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="hidden"):
        build_model("mlp", (3, 32, 32), 10, widht=3)


def test_too_small_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="too small"):
        build_model("convnet", (3, 4, 4), 10, width=4, depth=4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_normalisation_buffer(name: str) -> None:
    torch.manual_seed(0)
    kw = SMALL.get(name, {})
    plain = build_model(name, (3, 8, 8), 4, **kw).eval()
    normed = build_model(name, (3, 8, 8), 4, mean=(0.5,), std=(0.5, 0.5, 0.5), **kw).eval()
    normed.load_state_dict(plain.state_dict())  # constants are not in the state dict
    x = torch.rand(3, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(normed(x), plain((x - 0.5) / 0.5))
        assert not torch.allclose(normed(x), plain(x))


def test_bad_normalisation_constants() -> None:
    with pytest.raises(ValueError, match="mean has 2 values"):
        build_model("mlp", (3, 8, 8), 4, mean=(0.1, 0.2))
    with pytest.raises(ValueError, match="positive"):
        build_model("mlp", (1, 8, 8), 4, std=(0.0,))


def test_same_seed_same_weights() -> None:
    torch.manual_seed(1)
    a = build_model("lenet", (1, 8, 8), 10)
    torch.manual_seed(1)
    b = build_model("lenet", (1, 8, 8), 10)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        assert torch.equal(va, vb)
