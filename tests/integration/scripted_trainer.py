#!/usr/bin/env python3
"""A NumPy trainer with scripted results, for the trainer-link integration
tests: the external counterpart of the C++ test learner (learner/test_learner.h)
so aggregates can be checked exactly.

Learner params (site params with the job's merged over them; "<key>.<site>"
wins over "<key>"):
  size, init_scale, delta, sample_count   as the test learner
  metrics        "0:0.5,1:0.75": the reported validation accuracy per round
  bad.<round>    misbehave in that round: name | shape | dtype | nan | zero |
                 silent (never submit) | die (SIGKILL itself mid-task, once per
                 site: a marker file beside the link's socket)
"""
import os
import signal
import sys
import time

import numpy as np

import swarm


def param(task, key, default):
    return task.params.get(f"{key}.{task.site_name}",
                           task.params.get(key, default))


def initial(site_params):
    size = int(site_params.get("size", "256"))
    scale = np.float32(site_params.get("init_scale", "0.001"))
    return {"weight": np.arange(size, dtype=np.float32) * scale}


def main():
    # The initial model needs the params, which come with a task; the starting
    # site's first task is the initial-model request.
    # Test knobs: a short attach timeout, a fake protocol version.
    if "SCRIPTED_PROTOCOL_VERSION" in os.environ:
        swarm.link.PROTOCOL_VERSION = int(os.environ["SCRIPTED_PROTOCOL_VERSION"])
    try:
        site = swarm.connect(name="scripted-trainer", timeout=float(
            os.environ.get("SCRIPTED_CONNECT_TIMEOUT", "30")))
    except swarm.AttachRefused as err:
        print(f"scripted trainer: refused: {err}", file=sys.stderr, flush=True)
        sys.exit(3)
    print(f"scripted trainer attached to site {site.site}", file=sys.stderr,
          flush=True)
    for task in site.tasks():
        if task.kind == "initial":
            task.submit(initial(task.params), num_samples=1)
            continue
        scripted = dict(
            kv.split(":") for kv in param(task, "metrics", "").split(",") if kv)
        accuracy = float(scripted.get(str(task.round), "0"))
        task.report_validation({"accuracy": accuracy, "loss": 1 - accuracy})
        delta = np.float32(param(task, "delta", "0.125"))
        samples = int(param(task, "sample_count", "1"))
        weight = task.model["weight"]
        result = {"weight": weight + delta}
        bad = param(task, f"bad.{task.round}", "")
        try:
            if bad == "die":
                marker = os.path.join(
                    os.path.dirname(site.socket), f"died-in-round-{task.round}")
                if not os.path.exists(marker):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)
            elif bad == "silent":
                while not task.cancelled and time.time() * 1000 < \
                        task.deadline_unix_ms:
                    time.sleep(0.05)
                continue
            elif bad == "name":
                result = {"bogus": result["weight"]}
            elif bad == "shape":
                result = {"weight": result["weight"][:-1]}
            elif bad == "dtype":
                result = {"weight": result["weight"].astype(np.float64)}
            elif bad == "nan":
                result["weight"][3] = np.nan
            elif bad == "zero":
                samples = 0
            task.submit(result, num_samples=samples, check=not bad)
        except swarm.ResultRejected as err:
            print(f"scripted trainer: result refused: {err}", file=sys.stderr,
                  flush=True)
        except swarm.TaskCancelled as err:
            print(f"scripted trainer: {err}", file=sys.stderr, flush=True)
    print("scripted trainer: job ended", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
