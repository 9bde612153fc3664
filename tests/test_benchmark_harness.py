"""The benchmarks' shared step (benchmarks/_harness.py) times what its name says."""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import _harness  # noqa: E402


def ancestors(tensors):
    """The ops that the tensors depend on (data and control inputs)."""
    seen, todo = set(), [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if op in seen:
            continue
        seen.add(op)
        todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return seen


def test_fwd_bwd_step_runs_the_forward_pass():
    # The gradients of sum(y * g) do not need y: a step returning them alone ran
    # the two gradient passes only, since TF prunes what no output needs.
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((1, 8, 8, 2)), tf.float32)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    g = tf.constant(rng.standard_normal((1, 8, 8, 2)), tf.float32)
    call = _harness.build_step(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), x, w, g)
    graph = call.step.get_concrete_function(x, w).graph
    needed = {op.type for op in ancestors(graph.outputs)}
    assert {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"} <= needed
    dx, dw = call()
    assert dx.shape == x.shape and dw.shape == w.shape
