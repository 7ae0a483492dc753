"""Unit tests of the Python SDK that need no daemon (the trainer-link
integration tests, tests/integration/trainer_test.cc, run it end to end)."""
import os
import tempfile
import unittest

import numpy as np

import swarm
from swarm import safetensors
from swarm._proto import trainer_link_pb2 as pb
from swarm.link import Task


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_is_mapped_without_copy(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            a = np.arange(12, dtype=np.float32).reshape(3, 4)
            safetensors.write(path, {"a": a, "n": np.array(7, np.int64),
                                     "flag": np.array([True, False])},
                              metadata={"k": "v"})
            arrays, dtypes, metadata = safetensors.read(path)
            self.assertEqual(dtypes, {"a": "F32", "n": "I64", "flag": "BOOL"})
            self.assertEqual(metadata, {"k": "v"})
            np.testing.assert_array_equal(arrays["a"], a)
            self.assertEqual(arrays["n"].shape, ())
            self.assertIsInstance(arrays["a"].base, np.memmap)
            self.assertFalse(arrays["a"].flags.writeable)
            # Data starts 8-byte aligned (zero-copy views of any dtype).
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
            self.assertEqual((8 + n) % 8, 0)

    def test_bf16_conversions(self):
        values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
        bits = swarm.float32_to_bf16(values)
        self.assertEqual(bits.dtype, np.uint16)
        np.testing.assert_array_equal(swarm.bf16_to_float32(bits), values)
        # Round to nearest even: 1 + 2^-8 is halfway, goes to 1.0.
        self.assertEqual(swarm.bf16_to_float32(
            swarm.float32_to_bf16(np.array([1 + 2 ** -8], np.float32)))[0],
            1.0)
        self.assertTrue(np.isnan(swarm.bf16_to_float32(
            swarm.float32_to_bf16(np.array([np.nan], np.float32))))[0])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "b.safetensors")
            safetensors.write(path, {"w": swarm.BF16(bits)})
            arrays, dtypes, _ = safetensors.read(path)
            self.assertEqual(dtypes["w"], "BF16")
            np.testing.assert_array_equal(arrays["w"], bits)


class TaskCheckTest(unittest.TestCase):
    def make_task(self, d):
        path = os.path.join(d, "model.safetensors")
        safetensors.write(path, {"w": np.zeros((2, 3), np.float32),
                                 "b": np.zeros(3, np.float32)})
        proto = pb.TrainerTask(task_id=1, kind=pb.TRAINER_TASK_TRAIN,
                               model_path=path, round=4,
                               params={"lr": "0.1"})
        return Task(site=None, proto=proto)

    def test_mismatches_name_the_tensor(self):
        with tempfile.TemporaryDirectory() as d:
            task = self.make_task(d)
            self.assertEqual(task.round, 4)
            self.assertEqual(task.params, {"lr": "0.1"})
            good = {"w": np.ones((2, 3), np.float32),
                    "b": np.ones(3, np.float32)}
            task._check(good)
            cases = [
                ({**good, "x": np.ones(1, np.float32)}, "x", "not in"),
                ({"w": good["w"]}, "b", "missing"),
                ({**good, "w": np.ones((3, 2), np.float32)}, "w", "shape"),
                ({**good, "b": np.ones(3, np.float64)}, "b", "dtype F64"),
            ]
            for tensors, name, words in cases:
                with self.assertRaises(swarm.TensorMismatch) as caught:
                    task._check(tensors)
                self.assertEqual(caught.exception.tensor, name)
                self.assertIn(words, str(caught.exception))

    def test_connect_without_socket_is_a_link_error(self):
        env = os.environ.pop(swarm.SOCKET_ENV, None)
        try:
            with self.assertRaises(swarm.LinkError):
                swarm.connect()
            with tempfile.TemporaryDirectory() as d:
                with self.assertRaises(swarm.LinkError) as caught:
                    swarm.connect(socket=os.path.join(d, "none.sock"),
                                  timeout=0.5)
                self.assertIn("no Swarm daemon answers", str(caught.exception))
        finally:
            if env is not None:
                os.environ[swarm.SOCKET_ENV] = env


if __name__ == "__main__":
    unittest.main()


class PrivacyTest(unittest.TestCase):
    def test_privacy_cost_forms(self):
        from swarm.link import _privacy_cost
        self.assertIsNone(_privacy_cost(None))
        cost = _privacy_cost((0.01, 1.1, 100))
        self.assertAlmostEqual(cost.sampling_rate, 0.01)
        self.assertEqual(cost.steps, 100)
        cost = _privacy_cost({"sampling_rate": 0.5, "noise_multiplier": 2,
                              "steps": 3})
        self.assertEqual(cost.noise_multiplier, 2)
        with self.assertRaises(swarm.ResultRejected):
            _privacy_cost((0.0, 1.0, 1))

    def test_dp_sgd_step_is_the_clipped_mean_gradient(self):
        try:
            import torch
            from swarm.dp import dp_sgd
        except ImportError as e:  # torch is optional for the SDK
            self.skipTest(f"torch not installed: {e}")
        torch.manual_seed(0)
        x = torch.randn(12, 3)
        y = torch.randint(0, 2, (12,))
        model = torch.nn.Linear(3, 2)
        ref = torch.nn.Linear(3, 2)
        ref.load_state_dict(model.state_dict())
        clip = 0.1
        # Per-example gradients one by one, clipped, averaged.
        total = [torch.zeros_like(p) for p in ref.parameters()]
        for i in range(12):
            ref.zero_grad()
            torch.nn.functional.cross_entropy(ref(x[i:i + 1]),
                                              y[i:i + 1]).backward()
            grads = [p.grad.clone() for p in ref.parameters()]
            norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
            scale = min(1.0, clip / float(norm))
            for t, g in zip(total, grads):
                t += g * scale / 12
        expected = [p.detach() - 0.5 * t
                    for p, t in zip(ref.parameters(), total)]
        cost = dp_sgd(model, torch.nn.functional.cross_entropy, x, y,
                      sampling_rate=1.0, noise_multiplier=1e-9 / clip,
                      clip_norm=clip, lr=0.5, steps=1)
        self.assertEqual(tuple(cost), (1.0, 1e-9 / clip, 1))
        for p, e in zip(model.parameters(), expected):
            torch.testing.assert_close(p.detach(), e, atol=1e-6, rtol=1e-5)

    def test_dp_sgd_prox_mu_adds_the_proximal_gradient_after_noise(self):
        try:
            import torch
            from swarm.dp import dp_sgd
        except ImportError as e:  # torch is optional for the SDK
            self.skipTest(f"torch not installed: {e}")
        torch.manual_seed(1)
        x = torch.randn(10, 3)
        y = torch.randint(0, 2, (10,))
        model = torch.nn.Linear(3, 2)
        ref = torch.nn.Linear(3, 2)
        ref.load_state_dict(model.state_dict())
        anchor = [p.detach().clone() for p in ref.parameters()]
        clip, lr, mu = 0.1, 0.5, 3.0

        def clipped_mean():
            total = [torch.zeros_like(p) for p in ref.parameters()]
            for i in range(10):
                ref.zero_grad()
                torch.nn.functional.cross_entropy(ref(x[i:i + 1]),
                                                  y[i:i + 1]).backward()
                grads = [p.grad.clone() for p in ref.parameters()]
                norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
                scale = min(1.0, clip / float(norm))
                for t, g in zip(total, grads):
                    t += g * scale / 10
            return total

        # Two steps: the second one's proximal term is not zero and is not
        # clipped (mu * |w - w0| is far above the clip norm here).
        for _ in range(2):
            step = clipped_mean()
            with torch.no_grad():
                for p, g, a in zip(ref.parameters(), step, anchor):
                    p -= lr * (g + mu * (p - a))
        cost = dp_sgd(model, torch.nn.functional.cross_entropy, x, y,
                      sampling_rate=1.0, noise_multiplier=1e-9 / clip,
                      clip_norm=clip, lr=lr, steps=2, prox_mu=mu)
        self.assertEqual(tuple(cost), (1.0, 1e-9 / clip, 2))
        for p, e in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), e.detach(), atol=1e-6,
                                       rtol=1e-5)
        with self.assertRaises(ValueError):
            dp_sgd(model, torch.nn.functional.cross_entropy, x, y,
                   sampling_rate=1.0, noise_multiplier=1.0, clip_norm=clip,
                   lr=lr, steps=1, prox_mu=-1.0)

    def test_epsilon_matches_the_daemons_accountant(self):
        try:
            from swarm.dp import epsilon, noise_multiplier_for_epsilon
        except ImportError as e:
            self.skipTest(f"torch not installed: {e}")
        # privacy/rdp_test.cc's figures (all orders, the daemon's grid): the
        # integer orders alone never give less, and about the same at small
        # epsilon (at large epsilon the best order is fractional, below 2).
        for q, sigma, steps, daemon, slack in [
                (0.01, 4.0, 10000, 1.0355, 1.03),
                (256 / 60000, 1.1, 14063, 2.5967, 1.03),
                (0.05, 0.8, 500, 13.3353, 1.15)]:
            eps = epsilon(q, sigma, steps, 1e-5)
            self.assertGreaterEqual(eps, daemon * 0.999)
            self.assertLess(eps, daemon * slack)
        sigma = noise_multiplier_for_epsilon(0.01, 5000, 3.0)
        self.assertLessEqual(epsilon(0.01, sigma, 5000, 1e-5), 3.0)
        self.assertGreater(epsilon(0.01, sigma, 5000, 1e-5), 2.97)
