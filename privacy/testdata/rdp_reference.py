#!/usr/bin/python3
"""Independent reference for the C++ RDP accountant (privacy/rdp.cc).

The C++ code evaluates the Rényi divergence of the Poisson-subsampled Gaussian
with the binomial series of Mironov, Talwar and Zhang (2019). This script
instead integrates the divergence numerically on a fine grid, in both
directions (D_a(mu || mu0) and D_a(mu0 || mu), mu0 = N(0, s^2),
mu = (1 - q) N(0, s^2) + q N(1, s^2)), and takes the larger: it checks the
series and the claim that the first direction dominates at once.

Usage: rdp_reference.py ORDERS CONFIG...
  ORDERS  comma-separated orders (> 1) to minimise over
  CONFIG  q,sigma,steps,delta
Prints a JSON object: {"configs": [{"q", "sigma", "steps", "delta",
  "epsilon" (tight conversion), "epsilon_classic", "rdp" (one step, per
  order)}]}.
Needs NumPy only.
"""
import json
import math
import sys

import numpy as np


def log_integral(log_f, dz):
    top = np.max(log_f)
    return top + math.log(np.sum(np.exp(log_f - top)) * dz)


def one_step_rdp(q, sigma, order):
    """RDP of one step at `order` by numerical integration."""
    if q == 1.0:
        return order / (2 * sigma * sigma)
    lo = -20.0 * sigma - 2.0
    hi = order + 20.0 * sigma + 2.0
    dz = sigma / 400.0
    z = np.arange(lo, hi, dz)
    log_mu0 = -z * z / (2 * sigma * sigma) - 0.5 * math.log(2 * math.pi * sigma * sigma)
    # log(mu / mu0) = log((1 - q) + q exp((2z - 1) / (2 s^2)))
    log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma * sigma))
    forward = log_integral(log_mu0 + order * log_ratio, dz)
    backward = log_integral(log_mu0 + (1 - order) * log_ratio, dz)
    return max(forward, backward, 0.0) / (order - 1)


def convert(orders, rdp, delta, tight):
    best = math.inf
    for a, r in zip(orders, rdp):
        if tight:
            eps = r + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        else:
            eps = r - math.log(delta) / (a - 1)
        best = min(best, eps)
    return max(best, 0.0)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    orders = [float(x) for x in argv[1].split(",")]
    out = []
    for config in argv[2:]:
        q, sigma, steps, delta = config.split(",")
        q, sigma, steps, delta = float(q), float(sigma), int(steps), float(delta)
        one = [one_step_rdp(q, sigma, a) for a in orders]
        total = [r * steps for r in one]
        out.append({
            "q": q, "sigma": sigma, "steps": steps, "delta": delta,
            "epsilon": convert(orders, total, delta, True),
            "epsilon_classic": convert(orders, total, delta, False),
            "rdp": one,
        })
    json.dump({"configs": out}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
