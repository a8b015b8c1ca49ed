"""The draft-tree calls on mx.array (mlxkern.gated_delta_verify_tree_pool, _commit_tree_pool)
against the chain calls: every node's y is the last y of gated_delta_verify_pool on its path and
each tree's commit gated_delta_state_pool on that path, bit for bit; the refusals. Random inputs
from a seed printed at start (MLXK_PY_SEED to repeat one)."""

from __future__ import annotations

import os
import random
import unittest

import mlx.core as mx
import numpy as np

import mlxkern as mk

SEED = int(os.environ.get("MLXK_PY_SEED", random.randrange(1 << 30)))
print(f"test_tree: seed {SEED}")

HK, HV, DK, DV = 1, 2, 32, 8


def random_tree(rng, size):
    return [-1 if j == 0 or rng.random() < 0.1 else rng.randrange(j) for j in range(size)]


def path_to(parents, j):
    path = [j]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def bits(x):
    x = np.array(x.astype(mx.float32))
    return x.view(np.uint32)


class Trees(unittest.TestCase):
    def test_every_node_and_commit_equal_the_chain_calls(self):
        rng = random.Random(SEED)
        mx.random.seed(SEED)
        chain = list(range(-1, 7))
        for trees in ([[-1]], [chain], [[-1, 0, 0, 0, 0], random_tree(rng, 9), [-1, 0]],
                      [random_tree(rng, 12), [], random_tree(rng, 5)]):
            cu = [0]
            for t in trees:
                cu.append(cu[-1] + len(t))
            parents = [p for t in trees for p in t]
            total, n = len(parents), len(trees) + 2
            x = dict(q=(0.2 * mx.random.normal((1, total, HK, DK))).astype(mx.bfloat16),
                     k=(0.2 * mx.random.normal((1, total, HK, DK))).astype(mx.bfloat16),
                     v=mx.random.normal((1, total, HV, DV)).astype(mx.bfloat16),
                     a=mx.random.normal((1, total, HV)), b=mx.random.normal((1, total, HV)),
                     A_log=mx.random.uniform(-1.0, 1.0, (HV,)), dt_bias=mx.random.normal((HV,)))
            pool = 0.5 * mx.random.normal((n, HV, DV, DK))
            slots = [-1 if i == 1 and len(trees) > 2 else (3 * i + 1) % n for i in range(len(trees))]
            fresh = [rng.random() < 0.3 for _ in trees]
            y = mk.gated_delta_verify_tree_pool(**x, pool=pool, cu_nodes=cu, parents=parents,
                                                slots=slots, fresh=fresh)
            self.assertEqual(y.shape, (1, total, HV, DV))
            lengths, accepted, paths = [], [], []
            for i, tree in enumerate(trees):
                for j in range(len(tree)):
                    got = y[:, cu[i] + j]
                    if slots[i] < 0:
                        self.assertTrue(np.all(np.array(got.astype(mx.float32)) == 0))
                        continue
                    tokens = mx.array([cu[i] + p for p in path_to(tree, j)])
                    sub = {k: (v[:, tokens] if v.ndim > 1 else v) for k, v in x.items()}
                    want = mk.gated_delta_verify_pool(**sub, pool=pool, slots=[slots[i]],
                                                      fresh=[fresh[i]])
                    np.testing.assert_array_equal(bits(got), bits(want[:, -1]),
                                                  f"trees {trees} tree {i} node {j}")
                path = path_to(tree, rng.randrange(len(tree))) if tree else []
                lengths.append(len(path))
                accepted += path
                paths.append([cu[i] + p for p in path])
            kv = {k: v for k, v in x.items() if k != "q"}
            new = mk.gated_delta_commit_tree_pool(**kv, pool=pool, cu_nodes=cu, parents=parents,
                                                  slots=slots, accepted_lengths=lengths,
                                                  accepted_paths=accepted, fresh=fresh)
            for i, path in enumerate(paths):
                if slots[i] < 0:
                    continue
                tokens = mx.array(path, dtype=mx.int32)
                sub = {k: (v[:, tokens] if v.ndim > 1 else v) for k, v in kv.items()}
                want = mk.gated_delta_state_pool(**sub, pool=pool, slots=[slots[i]],
                                                 accepted_lengths=[len(path)], fresh=[fresh[i]])
                s = slots[i]
                np.testing.assert_array_equal(bits(new[s]), bits(want[s]), f"tree {i}'s commit")

    def test_refusals_name_the_argument(self):
        x = dict(q=mx.zeros((1, 3, HK, DK)), k=mx.zeros((1, 3, HK, DK)), v=mx.zeros((1, 3, HV, DV)),
                 a=mx.zeros((1, 3, HV)), b=mx.zeros((1, 3, HV)), A_log=mx.zeros((HV,)),
                 dt_bias=mx.zeros((HV,)))
        pool = mx.zeros((3, HV, DV, DK))
        with self.assertRaisesRegex(mk.InvalidArgumentError, r"parents\[1\] is 2"):
            mk.gated_delta_verify_tree_pool(**x, pool=pool, cu_nodes=[0, 3], parents=[-1, 2, 0],
                                            slots=[1])
        with self.assertRaisesRegex(mk.InvalidArgumentError, "slots has 1 values, expected one per tree"):
            mk.gated_delta_verify_tree_pool(**x, pool=pool, cu_nodes=[0, 2, 3], parents=[-1, 0, -1],
                                            slots=[1])
        kv = {k: v for k, v in x.items() if k != "q"}
        with self.assertRaisesRegex(mk.InvalidArgumentError, r"accepted_paths\[1\] is node 2"):
            mk.gated_delta_commit_tree_pool(**kv, pool=pool, cu_nodes=[0, 3], parents=[-1, 0, 1],
                                            slots=[1], accepted_lengths=[2], accepted_paths=[0, 2])


if __name__ == "__main__":
    unittest.main()
