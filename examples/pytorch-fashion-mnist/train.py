#!/usr/bin/env python3
"""A small CNN on Fashion-MNIST as a Swarm site's trainer (PyTorch).

  train.py [--prox-mu MU]       the site's trainer (launch or attach mode);
                                learner params come with each task;
                                --prox-mu: FedProx's mu when the task's
                                params have no prox_mu (default 0: off)
  train.py --evaluate FILE      test accuracy of a safetensors CNN
  train.py --baseline (--shard FILE | --central) --epochs E [--lr
           --lr-decay --seed --batch-size] [--dp-epsilon EPS [--dp-delta D
           --dp-clip-norm C]]
                                train from the same initial model without the
                                swarm, print test accuracy; with --dp-epsilon,
                                by DP-SGD within (EPS, D) over the E epochs
                                (a site alone at the swarm's ε), printing
                                the ε spent

Data: Debian's dataset-fashion-mnist IDX files. Each site trains on the shard
the built-in MLP learner would use (`swarm-mlp shard` writes it; learner param
`shard_file`), so results compare with the MLP demo.

Learner params: shard_file (required for the swarm), epochs (1), lr (0.05),
lr_decay (1: none; round r trains at lr * lr_decay**r, as a baseline's epoch
e does), momentum (0.9), batch_size (64), seed (1), data_dir, threads (1),
prox_mu (FedProx, Li et al. 2020: adds prox_mu / 2 * |w - w_global|^2 to the
loss, w_global being the round's global model; >= 0, default --prox-mu's,
0: plain local training; docs/trainers.md).
DP-SGD (docs/privacy.md): dp_noise_multiplier (off) or dp_target_epsilon
(the whole job's ε; the daemon adds dp_rounds and dp_delta), dp_clip_norm (1),
dp_sampling_rate (batch_size / training images): each round then takes
ceil(epochs / q) DP-SGD steps (swarm.dp) and reports their privacy cost with
the result, which the site's accountant charges.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
             for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(split, data_dir=DATA_DIR):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(images.astype(np.float32) / 255.0) - MEAN) / STD
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def read_shard(path):
    parts = {}
    with open(path) as f:
        for line in f:
            name, _, values = line.strip().partition(" ")
            parts[name] = np.array([int(v) for v in values.split(",") if v],
                                   np.int64)
    return torch.from_numpy(parts["train"]), torch.from_numpy(
        parts["validation"])


def read_safetensors(path):
    """F32 tensors of a safetensors file (all this CNN has)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        # A round's global model under a server optimizer also carries the
        # optimizer's state: not the CNN's.
        if name == "__metadata__" or name.startswith("swarm.server_optimizer."):
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name!r} is {info['dtype']}")
        begin, end = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(
            data[begin:end], np.float32).reshape(info["shape"]).copy())
    return out


def make_cnn(seed):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))


def evaluate(model, x, y, batch=1000):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            out = model(x[i:i + batch])
            loss += nn.functional.cross_entropy(out, y[i:i + batch],
                                                reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    return {"accuracy": correct / max(len(y), 1), "loss": loss / max(len(y), 1)}


def prox_mu_of(value, where):
    """FedProx's mu from a flag or a task param: a finite number >= 0."""
    try:
        mu = float(value)
    except (TypeError, ValueError):
        mu = float("nan")
    if not (mu >= 0 and math.isfinite(mu)):
        raise ValueError(f"{where}: {value!r} is not a finite number >= 0 "
                         f"(FedProx's mu; 0 is off)")
    return mu


def proximal_term(model, anchor, mu):
    """FedProx: mu / 2 * |w - w_global|^2 over every parameter, whose
    gradient mu * (w - w_global) pulls the local model towards the round's
    global model `anchor` (a list of detached copies of the parameters)."""
    return 0.5 * mu * sum((p - a).pow(2).sum()
                          for p, a in zip(model.parameters(), anchor))


def train(model, x, y, epochs, lr, momentum, batch, seed, prox_mu=0.0):
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    # FedProx's anchor: the weights training starts from (the global model).
    anchor = ([p.detach().clone() for p in model.parameters()]
              if prox_mu > 0 else None)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            if anchor is not None:
                loss = loss + proximal_term(model, anchor, prox_mu)
            loss.backward()
            opt.step()


def train_private(model, x, y, p, lr, prox_mu=0.0):
    """One round of DP-SGD (learner params dp_*); returns its privacy
    cost. FedProx's term is added after clipping and noise (swarm.dp)."""
    from swarm.dp import dp_sgd, noise_multiplier_for_epsilon
    q = float(p.get("dp_sampling_rate",
                    min(1.0, int(p.get("batch_size", "64")) / len(y))))
    steps = math.ceil(int(p.get("epochs", "1")) / q - 1e-9)
    if "dp_target_epsilon" in p:  # dp_rounds, dp_delta: set by the daemon
        sigma = noise_multiplier_for_epsilon(
            q, steps * int(p["dp_rounds"]), float(p["dp_target_epsilon"]),
            float(p.get("dp_delta", "1e-5")))
    else:
        sigma = float(p["dp_noise_multiplier"])
    model.train()
    return dp_sgd(model, nn.functional.cross_entropy, x, y,
                  sampling_rate=q, noise_multiplier=sigma,
                  clip_norm=float(p.get("dp_clip_norm", "1")), lr=lr,
                  steps=steps, prox_mu=prox_mu)


def run_swarm(default_prox_mu=0.0):
    import swarm  # The SDK: <build>/python on PYTHONPATH.
    import swarm.torch  # noqa: F401 (swarm.torch helpers)
    torch.set_num_threads(int(os.environ.get("SWARM_TORCH_THREADS", "1")))
    model = make_cnn(int(os.environ.get("SWARM_CNN_SEED", "1")))
    site = swarm.connect(
        name="pytorch-fashion-mnist",
        initial_model=lambda: swarm.torch.from_state_dict(model.state_dict()))
    data = None
    for task in site.tasks():
        p = task.params
        if data is None:
            x, y = load("train", p.get("data_dir", DATA_DIR))
            train_idx, val_idx = read_shard(p["shard_file"])
            data = (x[train_idx], y[train_idx], x[val_idx], y[val_idx])
            print(f"pytorch trainer, site {site.site}: {len(train_idx)} "
                  f"training / {len(val_idx)} validation images",
                  file=sys.stderr, flush=True)
        tx, ty, vx, vy = data
        model.load_state_dict(swarm.torch.to_state_dict(task.model))
        task.report_validation(evaluate(model, vx, vy))
        start = time.time()
        lr = float(p.get("lr", "0.05")) * float(
            p.get("lr_decay", "1")) ** task.round
        mu = (prox_mu_of(p["prox_mu"], "learner param prox_mu")
              if "prox_mu" in p else default_prox_mu)
        cost = None
        if "dp_noise_multiplier" in p or "dp_target_epsilon" in p:
            cost = train_private(model, tx, ty, p, lr, prox_mu=mu)
        else:
            train(model, tx, ty, int(p.get("epochs", "1")), lr,
                  float(p.get("momentum", "0.9")),
                  int(p.get("batch_size", "64")),
                  int(p.get("seed", "1")) * 100003 + task.round,
                  prox_mu=mu)
        task.submit(swarm.torch.from_state_dict(model.state_dict()),
                    num_samples=len(ty),
                    metrics={"train_seconds": time.time() - start},
                    privacy=cost)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--evaluate")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--shard")
    parser.add_argument("--central", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-decay", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dp-epsilon", type=float,
                        help="baseline by DP-SGD within this epsilon")
    parser.add_argument("--dp-delta", type=float, default=1e-5)
    parser.add_argument("--dp-clip-norm", type=float, default=1.0)
    parser.add_argument("--prox-mu", default="0",
                        help="FedProx's mu in the swarm, for tasks whose "
                             "params have no prox_mu (default 0: off)")
    args = parser.parse_args()
    try:
        prox_mu = prox_mu_of(args.prox_mu, "--prox-mu")
    except ValueError as e:
        parser.error(str(e))
    if prox_mu > 0 and (args.baseline or args.evaluate):
        parser.error("--prox-mu is for the swarm (it pulls each round's "
                     "training towards the round's global model)")
    if args.dp_epsilon is not None and not args.baseline:
        parser.error("--dp-epsilon is for --baseline; in the swarm, DP-SGD "
                     "comes with the task (learner param dp_target_epsilon)")
    if args.dp_epsilon is not None and args.dp_epsilon <= 0:
        parser.error(f"--dp-epsilon must be > 0, not {args.dp_epsilon}")
    if not 0 < args.dp_delta < 1:
        parser.error(f"--dp-delta must be in (0, 1), not {args.dp_delta}")
    if not args.evaluate and not args.baseline:
        return run_swarm(prox_mu)
    torch.set_num_threads(args.threads)
    test_x, test_y = load("test")
    model = make_cnn(args.seed)
    if args.evaluate:
        model.load_state_dict(read_safetensors(args.evaluate))
    else:
        x, y = load("train")
        if not args.central:
            train_idx, _ = read_shard(args.shard)
            x, y = x[train_idx], y[train_idx]
        start = time.time()
        # DP-SGD as the swarm runs it: one "round" per epoch, the noise set
        # for all of them to stay within --dp-epsilon.
        dp = None if args.dp_epsilon is None else {
            "epochs": "1", "batch_size": str(args.batch_size),
            "dp_target_epsilon": str(args.dp_epsilon),
            "dp_rounds": str(args.epochs), "dp_delta": str(args.dp_delta),
            "dp_clip_norm": str(args.dp_clip_norm)}
        cost = None
        for epoch in range(args.epochs):
            lr = args.lr * args.lr_decay ** epoch
            if dp is not None:
                cost = train_private(model, x, y, dp, lr)
            else:
                train(model, x, y, 1, lr, args.momentum, args.batch_size,
                      args.seed * 100003 + epoch)
        print(f"trained {args.epochs} epochs on {len(y)} images in "
              f"{time.time() - start:.0f}s", file=sys.stderr)
        if cost is not None:
            from swarm.dp import epsilon
            spent = epsilon(cost.sampling_rate, cost.noise_multiplier,
                            cost.steps * args.epochs, args.dp_delta)
            print(f"dp_epsilon={spent:.4f} dp_delta={args.dp_delta:g} "
                  f"noise_multiplier={cost.noise_multiplier:.4f} "
                  f"steps={cost.steps * args.epochs}")
    result = evaluate(model, test_x, test_y)
    print(f"test_accuracy={result['accuracy']:.4f} "
          f"test_loss={result['loss']:.4f}")


if __name__ == "__main__":
    main()
