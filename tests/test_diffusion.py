import numpy as np
import pytest
import torch
from torch import nn

from fedpipe.config.fl import LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.fl.local import local_train
from fedpipe.models import UNET_PRESETS, NoisePredictor, build_unet
from fedpipe.rng import torch_generator
from fedpipe.tasks import TASKS
from fedpipe.tasks.diffusion import DiffusionTask, ema_step_hook, ema_weights, make_ema

DIGITS = (1, 8, 8)


def _abar_numpy(T: int = 1000) -> np.ndarray:
    betas = np.linspace(1e-4, 0.02, T)  # Ho et al.'s linear schedule, computed independently
    return np.cumprod(1.0 - betas)


def _digits(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images[:n] / 16.0, dtype=torch.float32)[:, None]
    return x, torch.tensor(d.target[:n], dtype=torch.int64)


def _small_unet(**kw) -> NoisePredictor:
    torch.manual_seed(0)  # weight init only; every draw of the task comes from explicit generators
    return build_unet("digits_small", DIGITS, **kw)


class Oracle(nn.Module):
    """Predicts the true eps from x_t, knowing x0 (in [-1, 1]) and abar_t."""

    def __init__(self, x0: torch.Tensor, abar: torch.Tensor):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))
        self.x0, self.abar = x0, abar

    def forward(self, x_t, t, y=None):
        a = self.abar[t].view(-1, 1, 1, 1)
        return (x_t - a.sqrt() * self.x0) / (1 - a).sqrt() + self.dummy


class Recorder(nn.Module):
    """Returns ``scale * x_t``; counts and records its calls."""

    def __init__(self, in_shape=DIGITS, scale: float = 0.0):
        super().__init__()
        self.in_shape = in_shape
        self.scale = nn.Parameter(torch.tensor(scale))
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    def forward(self, x_t, t, y=None):
        self.calls.append((x_t.clone(), t.clone(), y))
        return self.scale * x_t


# ---------------------------------------------------------------- forward process and loss
def test_add_noise_matches_closed_form() -> None:
    task = DiffusionTask()
    abar = _abar_numpy()
    np.testing.assert_allclose(task.scheduler.alphas_cumprod.numpy(), abar, rtol=1e-5)
    g = torch.Generator().manual_seed(0)
    x0 = torch.rand((4, *DIGITS), generator=g) * 2 - 1
    eps = torch.randn((4, *DIGITS), generator=g)
    t = torch.tensor([0, 10, 500, 999])
    x_t = task.scheduler.add_noise(x0, eps, t)
    a = abar[t.numpy()].reshape(-1, 1, 1, 1)
    expect = np.sqrt(a) * x0.double().numpy() + np.sqrt(1 - a) * eps.double().numpy()
    np.testing.assert_allclose(x_t.numpy(), expect, atol=1e-5)


def test_loss_builds_x_t_from_its_generator() -> None:
    """The x_t the model sees = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, with (t, eps) drawn in that
    order from the generator, and x0 = 2 x - 1."""
    task = DiffusionTask()
    x, y = _digits(8)
    model = Recorder()
    task.loss(model, (x, y), torch_generator(3, "loss"))
    (x_t, t, labels), = model.calls
    g = torch_generator(3, "loss")
    t_ref = torch.randint(0, 1000, (8,), generator=g)
    eps = torch.randn(x.shape, generator=g)
    assert torch.equal(t, t_ref) and labels is None
    a = _abar_numpy()[t_ref.numpy()].reshape(-1, 1, 1, 1)
    expect = np.sqrt(a) * (2 * x.double().numpy() - 1) + np.sqrt(1 - a) * eps.double().numpy()
    np.testing.assert_allclose(x_t.numpy(), expect, atol=1e-5)


def test_oracle_loss_is_zero_and_zero_model_loss_is_one() -> None:
    task = DiffusionTask()
    x = torch.rand(256, *DIGITS, generator=torch.Generator().manual_seed(1))
    y = torch.zeros(256, dtype=torch.int64)
    oracle = Oracle(2 * x - 1, task.scheduler.alphas_cumprod)
    assert task.loss(oracle, (x, y), torch_generator(0, "a")).item() < 1e-6
    zero = Recorder(scale=0.0)
    # E||eps||^2 / d = 1; 16,384 draws: std of the mean ~ 0.011
    assert task.loss(zero, (x, y), torch_generator(0, "b")).item() == pytest.approx(1.0, abs=0.05)
    assert task.evaluate(zero, x, y, batch_size=100)["loss"] == pytest.approx(1.0, abs=0.05)


def test_loss_and_evaluate_are_deterministic() -> None:
    task = DiffusionTask()
    model = _small_unet()
    x, y = _digits(32)
    losses = [task.loss(model, (x, y), torch_generator(s, "loss")).item() for s in (1, 1, 2)]
    assert losses[0] == losses[1] != losses[2]
    model.train()
    e1, e2 = task.evaluate(model, x, y, batch_size=16), task.evaluate(model, x, y, batch_size=16)
    assert e1 == e2 and e1["n"] == 32 and model.training


# ---------------------------------------------------------------- sampling
@pytest.mark.parametrize(("sampler", "steps", "calls"), [("ddpm", None, 50), ("ddpm", 10, 10),
                                                         ("ddim", 7, 7)])
def test_sample_counts_shape_range(sampler: str, steps: int | None, calls: int) -> None:
    task = DiffusionTask(num_train_timesteps=50)
    model = Recorder(scale=0.3)
    out = task.sample(model, 5, sampler=sampler, steps=steps, generator=torch_generator(0, "s"))
    assert out.shape == (5, *DIGITS) and out.dtype == torch.float32 and out.device.type == "cpu"
    assert 0 <= out.min() and out.max() <= 1
    assert len(model.calls) == calls
    ts = [int(t[0]) for _, t, _ in model.calls]
    assert ts == sorted(ts, reverse=True) and ts[-1] == 0 and all(t.shape == (5,) for _, t, _ in model.calls)
    assert not out.is_inference() and model.training  # mode restored; usable as training data


def test_sample_batches() -> None:
    task = DiffusionTask(num_train_timesteps=20)
    model = Recorder(scale=0.3)
    out = task.sample(model, 5, sampler="ddim", steps=4, batch_size=2, generator=torch_generator(0, "s"))
    assert out.shape == (5, *DIGITS) and len(model.calls) == 3 * 4
    assert [c[0].shape[0] for c in model.calls[::4]] == [2, 2, 1]


def test_samples_are_deterministic() -> None:
    task = DiffusionTask(num_train_timesteps=20)
    model = _small_unet()

    def draw(seed: int, sampler: str) -> torch.Tensor:
        return task.sample(model, 3, sampler=sampler, steps=5 if sampler == "ddim" else None,
                           generator=torch_generator(seed, "sample"))

    for sampler in ("ddpm", "ddim"):
        a, b, c = draw(1, sampler), draw(1, sampler), draw(2, sampler)
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_sample_validates_labels_and_sampler() -> None:
    gen = torch_generator(0, "s")
    uncond = DiffusionTask(num_train_timesteps=10)
    cond = DiffusionTask(num_train_timesteps=10, conditional=True)
    model = _small_unet()
    with pytest.raises(ValueError, match="unconditional; sample.. takes no labels"):
        uncond.sample(model, 2, labels=torch.tensor([0, 1]), generator=gen)
    with pytest.raises(ValueError, match="conditional; sample.. needs labels"):
        cond.sample(model, 2, generator=gen)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        cond.sample(model, 2, labels=torch.tensor([0, 1, 2]), generator=gen)
    with pytest.raises(ValueError, match="unknown sampler 'euler'; allowed: ddpm, ddim"):
        uncond.sample(model, 2, sampler="euler", generator=gen)
    with pytest.raises(ValueError, match=r"steps must be in \[1, 10\]"):
        uncond.sample(model, 2, sampler="ddim", steps=11, generator=gen)


def test_conditional_task_and_model() -> None:
    task = DiffusionTask(num_train_timesteps=10, conditional=True)
    model = build_unet("digits_small", DIGITS, num_classes=10)
    x, y = _digits(4)
    assert torch.isfinite(task.loss(model, (x, y), torch_generator(0, "c")))
    out = task.sample(model, 2, labels=torch.tensor([3, 7]), sampler="ddim", steps=2,
                      generator=torch_generator(0, "c"))
    assert out.shape == (2, *DIGITS)
    with pytest.raises(ValueError, match="labels y are required"):
        model(x * 2 - 1, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="unconditional; it takes no labels"):
        _small_unet()(x, torch.zeros(4, dtype=torch.long), y)


# ---------------------------------------------------------------- presets
@pytest.mark.parametrize(("preset", "shape", "mparams"), [("digits_small", (1, 8, 8), 0.12),
                                                          ("mnist_paper", (1, 28, 28), 11.83),
                                                          ("cifar_paper", (3, 32, 32), 35.75)])
def test_presets(preset: str, shape: tuple[int, int, int], mparams: float) -> None:
    model = build_unet(preset, shape)
    n = sum(p.numel() for p in model.parameters())
    assert round(n / 1e6, 2) == mparams  # paper presets: FedDDPM Section VI-A1 (diffusers 0.42.1)
    if preset == "digits_small":
        x = torch.randn(2, *shape)
        assert model(x, torch.tensor([0, 999])).shape == x.shape


def test_build_unet_errors_and_overrides() -> None:
    with pytest.raises(ValueError, match="unknown UNet preset 'big'; allowed: cifar_paper, digits_small"):
        build_unet("big", DIGITS)
    with pytest.raises(ValueError, match=r"option\(s\) \['channels'\]; allowed: .*block_out_channels"):
        build_unet("digits_small", DIGITS, channels=3)
    with pytest.raises(ValueError, match=r"30x30 is not divisible by 2\*\*\(levels-1\) = 4"):
        build_unet("mnist_paper", (1, 30, 30))
    with pytest.raises(ValueError, match="not divisible"):
        _small_unet()(torch.zeros(1, 1, 9, 9), 0)
    model = build_unet("digits_small", DIGITS, block_out_channels=[32, 64])
    assert model.unet.config.block_out_channels == (32, 64) and model.in_shape == DIGITS
    assert UNET_PRESETS["digits_small"]["block_out_channels"] == (16, 32)  # presets not mutated
    assert TASKS["diffusion"] is DiffusionTask


def test_task_validates_schedule() -> None:
    with pytest.raises(ValueError, match="unknown beta_schedule 'cosine'; allowed: linear"):
        DiffusionTask(beta_schedule="cosine")


# ---------------------------------------------------------------- EMA and training
def test_ema_hook_and_swap() -> None:
    model = _small_unet()
    ema = make_ema(model, decay=0.9)
    hook = ema_step_hook(ema)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    hook(model)  # first EMA step: decay 0 -> EMA = current weights
    hook(model)
    current = [p.detach().clone() for p in model.parameters()]
    with ema_weights(ema, model):
        torch.testing.assert_close(next(model.parameters()), current[0])
        with torch.no_grad():
            next(model.parameters()).zero_()
    assert all(torch.equal(p, c) for p, c in zip(model.parameters(), current, strict=True))
    assert not torch.equal(current[0], before[0])


def test_training_reduces_eval_loss() -> None:
    task = DiffusionTask()
    x, y = _digits(64)
    model = _small_unet()
    initial = task.evaluate(model, x, y)["loss"]
    cfg = LocalTrainConfig(optimizer="adam", lr=2e-3, steps=150, batch_size=32)
    out = local_train(model, ClientData(x, y), task, cfg, 0, torch_generator(0, "train"))
    final = task.evaluate(model, x, y)["loss"]
    assert out["steps"] == 150
    assert final < 0.7 * initial, (initial, final)
