"""FID (fedpipe.metrics.fid): checked against an independent closed form (scipy's sqrtm), against the
true parameters of known Gaussians, and on corrupted sklearn digits."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from sklearn.datasets import load_digits
from torch import nn

from fedpipe.io import md5_file, read_metadata
from fedpipe.metrics.fid import (
    FID,
    META_KEY,
    ClassifierFeatures,
    ReferenceMismatchError,
    inception_extractor,
    load_reference,
    save_reference,
)
from fedpipe.models.classifiers import MLP
from fedpipe.rng import torch_generator, torch_seed

SEED = 20240601


def frechet_scipy(mu1, s1, mu2, s2) -> float:
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1^{1/2} S2 S1^{1/2})^{1/2}), written independently of
    torchmetrics (which uses the eigenvalues of S1 S2)."""
    r1 = scipy.linalg.sqrtm(s1).real
    cross = scipy.linalg.sqrtm(r1 @ s2 @ r1).real
    return float(np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(cross))


def frechet_std(mu1, s1, n1, mu2, s2, n2) -> float:
    """Delta-method standard error of the plug-in FID from n1 and n2 Gaussian samples.

    dF/dmu = 2 (mu1 - mu2); dF/dS1 = I - T and dF/dS2 = I - T^{-1}, with T the linear map that
    carries N(0, S1) to N(0, S2). For a sample covariance, Var tr(A (S^ - S)) = 2 tr(A S A S) / n and
    Var of the sample mean is S / n."""
    d = len(mu1)
    r1 = scipy.linalg.sqrtm(s1).real
    r1_inv = np.linalg.inv(r1)
    t = r1_inv @ scipy.linalg.sqrtm(r1 @ s2 @ r1).real @ r1_inv
    a1, a2 = np.eye(d) - t, np.eye(d) - np.linalg.inv(t)
    delta = mu1 - mu2
    var = (4 * delta @ (s1 / n1 + s2 / n2) @ delta
           + 2 * np.trace(a1 @ s1 @ a1 @ s1) / n1 + 2 * np.trace(a2 @ s2 @ a2 @ s2) / n2)
    return float(np.sqrt(var))


class Identity(nn.Module):
    """(N, d, 1, 1) "images" -> (N, d) features: FID on the raw vectors."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.num_features = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def gaussian(mu: np.ndarray, cov: np.ndarray, n: int, *keys: int) -> torch.Tensor:
    g = torch_generator(SEED, "test-fid-gaussian", *keys)
    z = torch.randn(n, len(mu), generator=g, dtype=torch.float64)
    x = torch.from_numpy(mu) + z @ torch.from_numpy(np.linalg.cholesky(cov)).T
    return x[:, :, None, None]


def empirical(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    v = x.flatten(1).numpy()
    return v.mean(axis=0), np.cov(v, rowvar=False, ddof=1)


# Two non-commuting covariances, so that (S1 S2)^{1/2} differs from S1^{1/2} S2^{1/2}.
MU1 = np.array([0.0, 1.0, -0.5, 2.0])
MU2 = np.array([0.5, 0.5, 0.0, 1.5])
A1 = np.array([[1.0, 0.2, 0.0, 0.3], [0.0, 0.8, 0.4, 0.0], [0.5, 0.0, 1.2, 0.1], [0.0, 0.3, 0.0, 0.6]])
A2 = np.array([[0.7, 0.0, 0.5, 0.0], [0.4, 1.1, 0.0, 0.2], [0.0, 0.0, 0.6, 0.5], [0.3, 0.0, 0.0, 1.3]])
S1 = A1 @ A1.T + 0.1 * np.eye(4)
S2 = A2 @ A2.T + 0.1 * np.eye(4)


@pytest.fixture(scope="module")
def gaussian_fid():
    n = 50_000
    x, y = gaussian(MU1, S1, n, 1), gaussian(MU2, S2, n, 2)
    fid = FID(Identity(4), "identity-4")
    return fid, x, y, fid.score(y, fid.reference(x))


def test_fid_matches_scipy_on_empirical_statistics(gaussian_fid):
    _, x, y, score = gaussian_fid
    expected = frechet_scipy(*empirical(x), *empirical(y))
    assert score == pytest.approx(expected, rel=1e-6)


def test_fid_matches_closed_form_of_true_gaussians(gaussian_fid):
    _, x, y, score = gaussian_fid
    n = len(x)
    truth = frechet_scipy(MU1, S1, MU2, S2)
    # Sampling error: 5 delta-method standard errors, plus the O(1/n) bias of the plug-in estimate
    # (E||mu1^ - mu2^||^2 = ||mu1 - mu2||^2 + tr(S1 + S2) / n; the square-root term adds as much).
    tol = 5 * frechet_std(MU1, S1, n, MU2, S2, n) + 2 * (np.trace(S1) + np.trace(S2)) / n
    assert tol < 0.05 * truth  # the check is sharp enough to catch a wrong formula
    assert abs(score - truth) < tol, (score, truth, tol)


def test_fid_is_symmetric_in_the_two_sets(gaussian_fid):
    fid, x, y, score = gaussian_fid
    assert fid.score(x, fid.reference(y)) == pytest.approx(score, rel=1e-9)


def test_batch_size_does_not_change_the_score(gaussian_fid):
    fid, x, y, score = gaussian_fid
    ref = fid.reference(x[:2000], batch_size=7)
    assert fid.score(y[:3000], ref, batch_size=13) == pytest.approx(
        fid.score(y[:3000], fid.reference(x[:2000])), rel=1e-9)


# ---- digits: a quickly trained classifier as extractor --------------------------------------------

@pytest.fixture(scope="module")
def digits():
    """sklearn digits (1797, 1, 8, 8) in [0, 1], in a seeded random order (so that the first and the
    second part are i.i.d. samples: the file is ordered by writer)."""
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    perm = torch.randperm(len(x), generator=torch_generator(SEED, "test-fid-digits"))
    return x[perm], torch.tensor(d.target)[perm]


@pytest.fixture(scope="module")
def digit_classifier(digits):
    """A small MLP trained on the first 1000 digits: the default kind of FID extractor."""
    x, y = digits
    with torch.random.fork_rng(devices=[]):  # init draws from a derived seed, not the global stream
        torch.manual_seed(torch_seed(SEED, "test-fid-init"))
        model = MLP((1, 8, 8), 10, hidden=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):  # full batch: deterministic
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[:1000]), y[:1000]).backward()
        opt.step()
    with torch.no_grad():
        acc = (model(x[1000:]).argmax(1) == y[1000:]).float().mean().item()
    assert acc > 0.9
    return model


@pytest.fixture(scope="module")
def digit_fid(digit_classifier):
    return FID(ClassifierFeatures(digit_classifier), "classifier:mlp")


def feature_variance(ref) -> float:
    n = ref["real_features_num_samples"].double()
    mu = ref["real_features_sum"] / n
    cov = (ref["real_features_cov_sum"] - n * torch.outer(mu, mu)) / (n - 1)
    return float(torch.trace(cov))


def test_fid_of_a_set_against_itself_is_zero(digits, digit_fid):
    x, _ = digits
    ref = digit_fid.reference(x[:1000])
    scale = feature_variance(ref)
    assert abs(digit_fid.score(x[:1000], ref)) < 1e-9 * scale
    # ... while another real sample of the same size is far above that tolerance
    assert digit_fid.score(x[1000:], ref) > 1e-3 * scale


def test_fid_grows_with_noise(digits, digit_fid):
    x, _ = digits
    sigmas = (0.0, 0.1, 0.2, 0.4)
    real = x[:1000]
    ref = digit_fid.reference(real)
    noise = torch.randn(real.shape, generator=torch_generator(SEED, "test-fid-noise"))
    scores = [digit_fid.score(real + s * noise, ref) for s in sigmas]
    assert all(a < b for a, b in zip(scores, scores[1:], strict=False)), scores
    assert scores[-1] > 10 * scores[1], scores
    # Against held-out real digits, FID starts at the finite-sample floor of two real sets; small
    # noise (0.1) moves it by less than that floor's sampling error, heavy noise far above it.
    held_out = x[1000:]
    noise = noise[:len(held_out)]
    floor, *noisy = [digit_fid.score(held_out + s * noise, ref) for s in sigmas]
    assert floor < noisy[1] < noisy[2] and noisy[2] > 5 * floor, (floor, noisy)


def test_classifier_features(digits, digit_classifier):
    x, _ = digits
    ext = ClassifierFeatures(digit_classifier)
    assert ext.num_features == digit_classifier.feature_dim == 32
    digit_classifier.train()
    with torch.inference_mode():
        f = ext(x[:5])
    assert digit_classifier.training  # the caller's mode is restored
    assert f.shape == (5, 32) and f.dtype == torch.float64
    with torch.inference_mode():
        assert torch.equal(f, digit_classifier.features(x[:5]).double())
    with pytest.raises(ValueError, match=r"expects \(1, 8, 8\)"):
        ext(torch.zeros(2, 1, 28, 28))


# ---- cached references --------------------------------------------------------------------------

def test_reference_round_trip(tmp_path, digits, digit_fid):
    x, _ = digits
    ref = digit_fid.reference(x[:1000])
    path = tmp_path / "ref.safetensors"
    save_reference(path, ref, digit_fid.name)
    loaded, name = load_reference(path)
    assert name == "classifier:mlp"
    assert read_metadata(path, META_KEY) == {"extractor": "classifier:mlp", "num_samples": 1000,
                                             "num_features": 32}
    for k, v in ref.items():
        assert torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype
    gen = x[1000:1400]
    assert digit_fid.score(gen, loaded) == digit_fid.score(gen, ref)
    assert digit_fid.score(gen, path) == digit_fid.score(gen, ref)
    again = tmp_path / "again.safetensors"
    digit_fid.save_reference(again, ref)
    assert md5_file(again) == md5_file(path)  # byte-reproducible (DVC hashes it)


def test_reference_from_another_extractor_is_refused(tmp_path, digits, digit_classifier, digit_fid):
    x, _ = digits
    path = tmp_path / "ref.safetensors"
    digit_fid.save_reference(path, digit_fid.reference(x[:100]))
    other = FID(ClassifierFeatures(digit_classifier), "classifier:lenet")
    with pytest.raises(ReferenceMismatchError, match="classifier:mlp.*classifier:lenet"):
        other.load_reference(path)
    with pytest.raises(ReferenceMismatchError):
        other.score(x[:100], path)
    wrong_width = FID(Identity(4), "identity-4").reference(gaussian(MU1, S1, 10, 3))
    with pytest.raises(ReferenceMismatchError, match="4 features; this extractor gives 32"):
        digit_fid.score(x[:100], wrong_width)


def test_too_few_images(digits, digit_fid):
    x, _ = digits
    with pytest.raises(ValueError, match="at least 2 reference images"):
        digit_fid.reference(x[:1])
    ref = digit_fid.reference(x[:10])
    with pytest.raises(ValueError, match="at least 2 generated images"):
        digit_fid.score(x[:1], ref)
    digit_fid.score(x[:2], ref)  # two is enough


def test_bad_inputs(digits, digit_fid):
    x, _ = digits
    with pytest.raises(TypeError, match="floats"):
        digit_fid.reference((x[:10] * 255).to(torch.uint8))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        digit_fid.reference(x[:10, 0])
    with pytest.raises(TypeError, match="num_features"):
        FID(nn.Flatten(), "flatten")


# ---- Inception -----------------------------------------------------------------------------------

def test_missing_inception_weights(tmp_path):
    missing = tmp_path / "nope" / "pt_inception-2015-12-05-6726825d.pth"
    with pytest.raises(FileNotFoundError, match=r"nope.*pt_inception-2015-12-05-6726825d\.pth"):
        inception_extractor(missing)


class _NotAWeight:
    pass


def test_inception_weights_must_be_a_plain_state_dict(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"w": _NotAWeight()}, path)
    with pytest.raises(ValueError, match="not a plain Inception state dict"):
        inception_extractor(path)


def test_inception_plumbing_with_random_weights(tmp_path, monkeypatch, digits):
    """A randomly initialised network saved in the weights-file format: the extractor loads it,
    takes grayscale and RGB [0, 1] images of any size and gives 2048-d features."""
    import torch_fidelity.feature_extractor_inceptionv3 as tf_inception
    from torchmetrics.image.fid import NoTrainInceptionV3

    with monkeypatch.context() as m:  # build the net without any weights file or download
        m.setattr(tf_inception, "load_state_dict_from_url", lambda *a, **k: {})
        m.setattr(tf_inception.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd: None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch_seed(SEED, "test-fid-inception"))
            net = NoTrainInceptionV3(name="inception-v3-compat", features_list=["2048"])
    path = tmp_path / "pt_inception-2015-12-05-6726825d.pth"
    torch.save(net.state_dict(), path)

    ext = inception_extractor(path)
    assert all(torch.equal(a, b) for a, b in zip(ext.net.state_dict().values(),
                                                 net.state_dict().values(), strict=True))
    x, _ = digits
    gray = x[:2]  # one batch size throughout: each new shape costs a slow first oneDNN call
    with torch.inference_mode():
        f_gray = ext(gray)
        f_rgb = ext(gray.expand(-1, 3, -1, -1))
    assert f_gray.shape == (2, 2048) and f_gray.dtype == torch.float64
    assert torch.isfinite(f_gray).all() and f_gray.std() > 0
    assert torch.equal(f_gray, f_rgb)  # grayscale is repeated to three channels
    fid = FID(ext, "inception-v3-2048")
    ref = fid.reference(gray)
    assert ref["real_features_sum"].shape == (2048,)
    assert torch.allclose(ref["real_features_sum"], f_gray.sum(0))
    # (no fid.score here: torchmetrics' eigvals of a 2048x2048 product takes tens of CPU seconds;
    # scoring is the same code path as with the classifier extractor)
    with pytest.raises(ValueError, match="1- or 3-channel"):
        ext(torch.zeros(2, 2, 8, 8))
