"""DP-SGD for PyTorch trainers (docs/privacy.md).

    from swarm.dp import dp_sgd
    cost = dp_sgd(model, torch.nn.functional.cross_entropy, x, y,
                  sampling_rate=256 / len(x), noise_multiplier=1.1,
                  clip_norm=1.0, lr=0.1, steps=len(x) // 256)
    task.submit(weights, num_samples=len(x), privacy=cost)

Each step samples every example independently with probability
`sampling_rate` (Poisson sampling), computes each sampled example's gradient
(functorch's vmap over grad: exact per-example gradients), clips each to L2
norm `clip_norm`, sums them, adds Gaussian noise of standard deviation
`noise_multiplier * clip_norm` to every coordinate, divides by the expected
batch size and takes an SGD step. The site's accountant charges the returned
PrivacyCost when the result is submitted with it.

Sampling and noise draw from os.urandom-seeded generators, never from a
seed the other sites could know.
"""
from __future__ import annotations

import math
import os
from typing import Callable, NamedTuple

import torch as _torch


class PrivacyCost(NamedTuple):
    """What one round's DP-SGD cost: the trainer link's PrivacyCost."""
    sampling_rate: float
    noise_multiplier: float
    steps: int


def _functional():
    try:  # torch >= 2.0
        from torch.func import functional_call, grad, vmap
        return functional_call, grad, vmap
    except ImportError:  # Debian's torch 1.13 ships functorch
        from functorch import grad, vmap
        from torch.nn.utils.stateless import functional_call
        return functional_call, grad, vmap


def _secret_generator() -> _torch.Generator:
    gen = _torch.Generator()
    gen.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return gen


def dp_sgd(model: _torch.nn.Module,
           loss_fn: Callable[[_torch.Tensor, _torch.Tensor], _torch.Tensor],
           inputs: _torch.Tensor, targets: _torch.Tensor, *,
           sampling_rate: float, noise_multiplier: float, clip_norm: float,
           lr: float, steps: int, prox_mu: float = 0.0) -> PrivacyCost:
    """Trains `model` in place for `steps` DP-SGD steps on (inputs, targets)
    and returns the privacy cost to report with the result. `loss_fn(output,
    target)` must return the mean loss of its batch (it is called on batches
    of one).

    prox_mu > 0: FedProx (docs/trainers.md). Every step adds
    prox_mu * (w - w0) to the noisy mean gradient, w0 being the weights the
    model had on entry (the round's global model). It is added after the
    clipping and the noise: it depends on no training example, so it costs
    no privacy (the returned cost is the same)."""
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not (prox_mu >= 0 and math.isfinite(prox_mu)):
        raise ValueError(f"prox_mu must be finite and >= 0, got {prox_mu}")
    functional_call, grad, vmap = _functional()
    names = [name for name, _ in model.named_parameters()]
    params = {name: p.detach() for name, p in model.named_parameters()}
    anchor = ({k: v.clone() for k, v in params.items()} if prox_mu > 0
              else None)

    def loss_one(p, x, y):
        out = functional_call(model, p, (x.unsqueeze(0),))
        return loss_fn(out, y.unsqueeze(0))

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))
    gen = _secret_generator()
    n = inputs.shape[0]
    expected_batch = sampling_rate * n
    sigma = noise_multiplier * clip_norm
    for _ in range(steps):
        picked = _torch.rand(n, generator=gen) < sampling_rate
        xb, yb = inputs[picked], targets[picked]
        if xb.shape[0] > 0:
            grads = per_example(params, xb, yb)
            norms = _torch.sqrt(sum(grads[k].flatten(1).pow(2).sum(1)
                                    for k in names))
            scale = _torch.clamp(clip_norm / (norms + 1e-12), max=1.0)
            summed = {k: _torch.einsum("b,b...->...", scale, grads[k])
                      for k in names}
        else:
            summed = {k: _torch.zeros_like(params[k]) for k in names}
        for k in names:
            noise = _torch.normal(0.0, sigma, size=params[k].shape,
                                  generator=gen)
            update = (summed[k] + noise.to(params[k].dtype)) / expected_batch
            if anchor is not None:
                update = update + prox_mu * (params[k] - anchor[k])
            params[k] = params[k] - lr * update
    with _torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return PrivacyCost(float(sampling_rate), float(noise_multiplier),
                       int(steps))


def _log_add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi))


def _rdp_integer(q: float, sigma: float, order: int) -> float:
    """RDP of one Poisson-subsampled Gaussian step at an integer order: the
    finite binomial sum of Mironov, Talwar, Zhang 2019, in log space."""
    if q == 1.0:
        return order / (2 * sigma * sigma)
    log_a = -math.inf
    for k in range(order + 1):
        log_a = _log_add(log_a, (math.lgamma(order + 1) - math.lgamma(k + 1) -
                                 math.lgamma(order - k + 1)) +
                         (order - k) * math.log1p(-q) + k * math.log(q) +
                         (k * k - k) / (2 * sigma * sigma))
    return max(log_a, 0.0) / (order - 1)


def epsilon(sampling_rate: float, noise_multiplier: float, steps: int,
            delta: float) -> float:
    """ε of `steps` DP-SGD steps for `delta`, over the integer orders 2..256
    (the daemon's accountant, privacy/rdp.h, also uses fractional orders, so
    its ε is at most this one: about the same for ε of a few, up to ~10% less
    at ε >= 10). For planning a noise multiplier; the site's accountant is
    the one that counts."""
    best = math.inf
    for order in list(range(2, 65)) + [80, 96, 128, 256]:
        rdp = steps * _rdp_integer(sampling_rate, noise_multiplier, order)
        eps = (rdp + math.log1p(-1 / order) -
               (math.log(delta) + math.log(order)) / (order - 1))
        best = min(best, eps)
    return max(best, 0.0)


def noise_multiplier_for_epsilon(sampling_rate: float, steps: int,
                                 target_epsilon: float,
                                 delta: float = 1e-5) -> float:
    """The smallest noise multiplier (to 0.1%) whose `steps` steps stay
    within `target_epsilon`; ValueError when none up to 1e4 does."""
    lo, hi = 0.05, 1e4
    if epsilon(sampling_rate, hi, steps, delta) > target_epsilon:
        raise ValueError(f"no noise multiplier reaches epsilon "
                         f"{target_epsilon} in {steps} steps")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if epsilon(sampling_rate, mid, steps, delta) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi
