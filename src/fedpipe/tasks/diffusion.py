"""DDPM training and sampling as a :class:`~fedpipe.tasks.Task`: the loss FedDDPM federates.

Papers: FedDDPM (Peng et al., "Federated Learning for Diffusion Models", arXiv 2503.06426; Sections
III-A1, VI-A1 and VI-A2) trains, on every client, in the warm-up and in the server calibration, the
simplified DDPM objective of Ho et al. ("Denoising Diffusion Probabilistic Models", NeurIPS 2020):

- forward process, closed form (eq. 3):   x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps,  eps ~ N(0, I),
  with alpha_t = 1 - beta_t and abar_t = prod_{s<=t} alpha_s;
- training loss (eq. 6, l_simple):        E_{t, x_0, eps} || eps - eps_w(x_t, t) ||^2,  t ~ Uniform;
- reverse process (eq. 4) with a *fixed* variance (l_simple learns only the mean): ancestral sampling
  x_{t-1} = mu_w(x_t, t) + sigma_t z, sigma_t^2 = the posterior variance beta~_t (diffusers'
  ``variance_type="fixed_small"``), with the predicted x_0 clipped to [-1, 1] (``clip_sample=True``).

The schedule and the samplers are diffusers' ``DDPMScheduler`` / ``DDIMScheduler`` (library first); this
module adds only the seeded noise draws and the [0, 1] <-> [-1, 1] pixel scaling. diffusers counts
timesteps 0..T-1 where the paper counts 1..T.

Defaults and where they come from:

- ``num_train_timesteps=1000``: the paper's CIFAR10/100 value; its MNIST UNet uses 500 (pass 500).
- linear betas ``1e-4 -> 0.02``: Ho et al.'s schedule; **inferred**, the paper does not state it.
- fixed variance, epsilon prediction, clipping of the predicted x_0, pixels scaled to [-1, 1], t uniform:
  **inferred** (standard Ho et al.; the paper only states that it uses l_simple).
- sampling with full DDPM ancestral sampling over all T steps: the paper's (used for its auxiliary data
  and FIDs). DDIM (Song et al. 2021, eta = 0, diffusers' default "leading" timestep spacing) is an
  accelerated alternative for quick looks; it is not in the paper.

Unconditional by default, as in the paper (labels only shape the partitions); ``conditional=True`` feeds
the labels to a class-conditional :class:`~fedpipe.models.unet.NoisePredictor`.

Determinism: every draw (t, eps, the initial noise x_T, the per-step noise) comes from the
``torch.Generator`` the caller passes (a stream of :mod:`fedpipe.rng`). On the CPU it is used as it
is. On another device the draws are made there, from a generator on that device seeded from the
caller's stream (:func:`fedpipe.device.generator_on`), so no noise is drawn on the host and copied
over per step, and the same stream gives the same draws on the same device. On CUDA the UNet runs
under bf16 autocast (``bf16_autocast``, default on; never on the CPU), and the training forward
through ``torch.compile`` with ``compile`` (opt-in; CUDA only).

EMA of the weights (optional; not mentioned by the paper, Ho et al. use decay 0.9999) uses diffusers'
``EMAModel``. With a local-training loop that calls ``step_hook(model)`` after each optimizer step::

    ema = make_ema(model, decay=0.999)
    local_train(model, data, task, cfg, round_, gen, step_hook=ema_step_hook(ema))
    with ema_weights(ema, model):          # model temporarily holds the EMA weights
        images = task.sample(model, 64, generator=gen)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler, DDPMScheduler
from diffusers.training_utils import EMAModel
from torch import nn
from tqdm.auto import tqdm

from fedpipe.device import autocast, compiled, generator_on
from fedpipe.rng import torch_generator

Batch = tuple[torch.Tensor, torch.Tensor]  # = fedpipe.tasks.Batch (not imported: that package imports us)
SAMPLERS = ("ddpm", "ddim")
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid")


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class DiffusionTask:
    """Ho et al.'s DDPM epsilon-prediction task (the FedDDPM loss) with DDPM / DDIM sampling."""

    name = "diffusion"

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02,
                 beta_schedule: str = "linear", conditional: bool = False,
                 bf16_autocast: bool = True, compile: bool = False):
        if int(num_train_timesteps) < 1:
            raise ValueError(f"num_train_timesteps must be >= 1, got {num_train_timesteps}")
        if beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"unknown beta_schedule {beta_schedule!r}; allowed: {', '.join(BETA_SCHEDULES)}")
        if not 0 < beta_start < beta_end < 1:
            raise ValueError(f"need 0 < beta_start < beta_end < 1, got {beta_start}, {beta_end}")
        self.num_train_timesteps = int(num_train_timesteps)
        self.conditional = bool(conditional)
        self.bf16_autocast = bool(bf16_autocast)  # CUDA only
        self.compile = bool(compile)  # CUDA only, training forward only
        self.scheduler = DDPMScheduler(
            num_train_timesteps=self.num_train_timesteps, beta_start=beta_start, beta_end=beta_end,
            beta_schedule=beta_schedule, variance_type="fixed_small", prediction_type="epsilon",
            clip_sample=True)

    # ---------------------------------------------------------------- training objective (eq. 6)
    def _noise(self, x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """t ~ Uniform{0..T-1} and eps ~ N(0, I), drawn in this order on ``x``'s device, from
        ``generator`` (on the CPU) or its derived generator on that device (no host copy)."""
        g = generator_on(generator, x.device)
        t = torch.randint(0, self.num_train_timesteps, (x.shape[0],), generator=g, device=g.device)
        eps = torch.randn(x.shape, generator=g, dtype=torch.float32, device=g.device)
        return t, eps

    def _eps_sse(self, model: nn.Module, batch: Batch, generator: torch.Generator,
                 reduction: str, train: bool = False) -> torch.Tensor:
        x, y = batch
        device = _device(model)
        x0 = x.to(device, torch.float32) * 2 - 1  # [0, 1] -> [-1, 1]
        t, eps = self._noise(x0, generator)
        x_t = self.scheduler.add_noise(x0, eps, t)  # eq. 3
        labels = y.to(device) if self.conditional else None
        net = compiled(model, device, self.compile and train)
        with autocast(device, self.bf16_autocast):
            pred = net(x_t, t, labels)
        return F.mse_loss(pred.float(), eps, reduction=reduction)

    def loss(self, model: nn.Module, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        """l_simple on one batch: mean over pixels and samples of (eps - eps_w(x_t, t))^2."""
        return self._eps_sse(model, batch, generator, "mean", train=True)

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int = 256) -> dict[str, float]:
        """Mean eps-MSE on (x, y) with a fixed noise stream (``torch_generator(0, "diffusion-eval")``), so
        two models or two rounds are compared on the same (t, eps) draws for the same data and batch
        size."""
        gen = torch_generator(0, "diffusion-eval")
        was_training = model.training
        model.eval()
        try:
            sse = torch.zeros((), dtype=torch.float64, device=_device(model))
            for i in range(0, len(x), batch_size):
                batch = (x[i:i + batch_size], y[i:i + batch_size])
                sse += self._eps_sse(model, batch, gen, "sum").double()
        finally:
            model.train(was_training)
        elements = x.numel()
        return {"loss": float(sse) / elements if elements else 0.0, "n": float(len(x))}

    # ---------------------------------------------------------------- sampling (eq. 4)
    def make_sampler(self, sampler: str = "ddpm", steps: int | None = None
                     ) -> DDPMScheduler | DDIMScheduler:
        """A fresh scheduler (they are stateful) with its timesteps set: ``ddpm`` ancestral sampling over
        ``steps`` (default all T) steps, or ``ddim`` with ``steps`` (default T) steps."""
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; allowed: {', '.join(SAMPLERS)}")
        steps = self.num_train_timesteps if steps is None else int(steps)
        if not 1 <= steps <= self.num_train_timesteps:
            raise ValueError(f"steps must be in [1, {self.num_train_timesteps}], got {steps}")
        cls = DDPMScheduler if sampler == "ddpm" else DDIMScheduler
        sched = cls.from_config(self.scheduler.config)
        sched.set_timesteps(steps)
        return sched

    def _check_labels(self, labels: torch.Tensor | None, n: int) -> torch.Tensor | None:
        if not self.conditional:
            if labels is not None:
                raise ValueError("this DiffusionTask is unconditional; sample() takes no labels")
            return None
        if labels is None:
            raise ValueError("this DiffusionTask is conditional; sample() needs labels "
                             "(an int64 tensor of length n)")
        labels = torch.as_tensor(labels, device="cpu")  # moved per batch in sample()
        if labels.shape != (n,) or labels.is_floating_point():
            raise ValueError(f"labels must be an integer tensor of shape ({n},), "
                             f"got {labels.dtype} {tuple(labels.shape)}")
        return labels.long()

    def sample(self, model: nn.Module, n: int, *, labels: torch.Tensor | None = None,
               sampler: str = "ddpm", steps: int | None = None, generator: torch.Generator,
               batch_size: int = 256, progress: bool = False, desc: str | None = None
               ) -> torch.Tensor:
        """``n`` images (N, C, H, W) in [0, 1] on the CPU, drawn from ``model`` in batches of ``batch_size``.

        ``sampler="ddpm"``: ancestral sampling over all T steps (the paper's); ``"ddim"``: DDIM, eta 0,
        with ``steps`` steps. The initial noise x_T and the per-step noise come from ``generator``.
        ``labels`` (int64, length n) is required for a conditional task and refused otherwise. The image
        shape is ``model.in_shape`` (a :class:`~fedpipe.models.unet.NoisePredictor`). ``progress``
        shows a tqdm bar over the denoising steps, named ``desc`` (default: the sampler's name).
        """
        labels = self._check_labels(labels, n)
        sched = self.make_sampler(sampler, steps)
        step_kwargs = {"eta": 0.0} if sampler == "ddim" else {}
        in_shape = tuple(model.in_shape)
        device = _device(model)
        n_batches = -(-n // batch_size)
        was_training = model.training
        model.eval()
        out: list[torch.Tensor] = []
        try:
            with torch.inference_mode(), tqdm(total=n_batches * len(sched.timesteps), disable=not progress,
                                              desc=desc or f"{sampler} sampling", unit="step", leave=False,
                                              mininterval=1.0) as bar:
                g = generator_on(generator, device)  # the caller's generator on the CPU
                for start in range(0, n, batch_size):
                    b = min(batch_size, n - start)
                    x = torch.randn((b, *in_shape), generator=g, device=g.device)
                    yb = None if labels is None else labels[start:start + b].to(device)
                    for t in sched.timesteps:
                        t_batch = torch.full((b,), int(t), dtype=torch.long, device=device)
                        with autocast(device, self.bf16_autocast):
                            eps = model(x, t_batch, yb)
                        x = sched.step(eps.float(), t, x, generator=g, **step_kwargs).prev_sample
                        bar.update()
                    out.append(((x.clamp(-1, 1) + 1) / 2).cpu())
        finally:
            model.train(was_training)
        # Concatenated outside inference mode: a normal tensor, usable later as training data.
        return torch.cat(out) if out else torch.zeros((0, *in_shape), device="cpu")


# -------------------------------------------------------------------- EMA of the weights (optional)
def make_ema(model: nn.Module, decay: float = 0.9999, **kwargs) -> EMAModel:
    """diffusers' ``EMAModel`` over ``model``'s parameters (its warm-up: decay_k = min(decay,
    (1 + k) / (10 + k)) at step k). ``kwargs`` go to ``EMAModel`` (e.g. ``use_ema_warmup=True``)."""
    return EMAModel(model.parameters(), decay=decay, **kwargs)


def ema_step_hook(ema: EMAModel) -> Callable[[nn.Module], None]:
    """A ``step_hook(model)`` for a training loop: update ``ema`` after each optimizer step."""
    def hook(model: nn.Module) -> None:
        ema.step(model.parameters())
    return hook


@contextlib.contextmanager
def ema_weights(ema: EMAModel, model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily load the EMA weights into ``model`` (e.g. to evaluate or sample); restored on exit."""
    ema.store(model.parameters())
    ema.copy_to(model.parameters())
    try:
        yield model
    finally:
        ema.restore(model.parameters())
