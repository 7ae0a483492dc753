#!/usr/bin/env python3
"""A NumPy-only Swarm trainer: multinomial logistic regression on
Fashion-MNIST (Debian's dataset-fashion-mnist), over the trainer link.

Run it as a site's trainer: in launch mode the daemon starts it (site config
"trainer": {"mode": "launch", "command": ["python3", "train.py"],
"env": {"PYTHONPATH": "<build>/python"}}); in attach mode start it yourself
with SWARM_TRAINER_SOCKET=<workspace>/trainer/link.sock.

Learner params (site config learner.params, job learner_params win):
  sites, site_index   this site's share of the training data (seeded split)
  data_dir            default /usr/share/datasets/fashion-mnist
  epochs (1), lr (0.5), batch_size (128), seed (1), max_train_samples (0=all)
"""
import gzip
import os
import sys

import numpy as np

import swarm

CLASSES = 10
PIXELS = 28 * 28


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
             for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_shard(params):
    data_dir = params.get("data_dir", "/usr/share/datasets/fashion-mnist")
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
    sites = int(params.get("sites", "1"))
    index = int(params.get("site_index", "0"))
    rng = np.random.default_rng(int(params.get("seed", "1")))
    order = rng.permutation(len(labels))
    limit = int(params.get("max_train_samples", "0"))
    if limit:
        order = order[:limit]
    mine = order[index::sites]
    x = images[mine].reshape(-1, PIXELS).astype(np.float32) / 255.0
    y = labels[mine].astype(np.int64)
    held = len(y) // 10
    return (x[held:], y[held:]), (x[:held], y[:held])


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def evaluate(w, b, x, y):
    p = softmax(x @ w + b)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    return {"accuracy": float((p.argmax(axis=1) == y).mean()), "loss": loss}


def train(w, b, x, y, params, round_):
    epochs = int(params.get("epochs", "1"))
    lr = float(params.get("lr", "0.5"))
    batch = int(params.get("batch_size", "128"))
    rng = np.random.default_rng(int(params.get("seed", "1")) * 1000 + round_)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch):
            idx = order[start:start + batch]
            p = softmax(x[idx] @ w + b)
            p[np.arange(len(idx)), y[idx]] -= 1.0
            w -= lr * (x[idx].T @ p) / len(idx)
            b -= lr * p.mean(axis=0)
    return w, b


def main():
    initial = {"weight": np.zeros((PIXELS, CLASSES), np.float32),
               "bias": np.zeros((CLASSES,), np.float32)}
    site = swarm.connect(name="numpy-logreg", initial_model=initial)
    shard = None
    for task in site.tasks():
        if shard is None:
            shard = load_shard(task.params)
            print(f"numpy-logreg: site {site.site}: {len(shard[0][1])} "
                  f"training samples", file=sys.stderr, flush=True)
        (x, y), (vx, vy) = shard
        w = np.array(task.model["weight"])  # Writable copies to train.
        b = np.array(task.model["bias"])
        task.report_validation(evaluate(w, b, vx, vy))
        w, b = train(w, b, x, y, task.params, task.round)
        task.submit({"weight": w, "bias": b}, num_samples=len(y))


if __name__ == "__main__":
    main()
