"""Operands of unknown rank (issue 52, item 7): tf.function(input_signature=
[tf.TensorSpec(None)] * 2), which tf.nn.conv1d/conv2d/conv3d run. Every algorithm (and
the pure-TF path under --pure-tf) computes the convolution and its gradients; a wrong
rank found when the graph runs raises InvalidArgumentError naming the operand (the
rank is checked before TF's kernels see the operand: oneDNN's Conv2D aborts the
process on a rank-3 input in TF 2.21)."""
import json

import pytest
import tensorflow as tf

import tfbigconv
from conftest import TESTS_DIR, random_case, run_python
from reference import (conv1d_reference, conv1d_reference_grads, conv2d_reference,
                       conv2d_reference_backprop_filter, conv2d_reference_backprop_input,
                       conv3d_reference, conv3d_reference_grads, rel_l2)

UNKNOWN = [tf.TensorSpec(None, tf.float32)] * 2


def _ref2d(x, w, dy):
    return (conv2d_reference(x, w, padding="SAME"),
            conv2d_reference_backprop_input(dy, w, x.shape, padding="SAME"),
            conv2d_reference_backprop_filter(x, dy, w.shape, padding="SAME"))


def _ref1d(x, w, dy):
    return (conv1d_reference(x, w, padding="SAME"),
            *conv1d_reference_grads(x, w, dy, padding="SAME"))


def _ref3d(x, w, dy):
    return (conv3d_reference(x, w, padding="SAME"),
            *conv3d_reference_grads(x, w, dy, padding="SAME"))


CASES = {
    "1d": (tfbigconv.bigconv1d, tf.nn.conv1d, (2, 40, 3), (9, 3, 4), 1, _ref1d),
    "2d": (tfbigconv.bigconv2d, tf.nn.conv2d, (2, 17, 19, 3), (5, 4, 3, 4), 1, _ref2d),
    "3d": (tfbigconv.bigconv3d, tf.nn.conv3d, (2, 6, 7, 8, 3), (3, 4, 2, 3, 4), [1] * 5,
           _ref3d),
}


@pytest.mark.parametrize("algorithm", ["auto", "tf", "direct", "fft"])
@pytest.mark.parametrize("rank", list(CASES))
def test_unknown_rank_runs_with_gradients(rank, algorithm):
    ours, theirs, x_shape, w_shape, strides, reference = CASES[rank]
    x, w = tf.constant(random_case(x_shape, 0)), tf.constant(random_case(w_shape, 1))

    @tf.function(input_signature=UNKNOWN)
    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = ours(x, w, strides, "SAME", algorithm=algorithm)
            loss = tf.reduce_sum(y * dy)
        return [y] + tape.gradient(loss, [x, w])

    want = theirs(x, w, strides, "SAME")  # TF runs it too
    dy = tf.constant(random_case(want.shape, 2))
    got = step(x, w)
    assert got[0].shape == want.shape
    for g, r in zip(got, reference(x.numpy(), w.numpy(), dy.numpy())):
        assert rel_l2(g.numpy(), r) < 1e-4


# A wrong rank that only the running graph shows: (rank of the case, operand, shape,
# fragment of the message).
WRONG = [
    ("1d", "input", (40, 3), "input must be rank 3"),
    ("1d", "filters", (9, 3), "filters must be rank 3"),
    ("2d", "input", (17, 19, 3), "input must be rank 4"),
    ("2d", "input", (1, 2, 17, 19, 3), "input must be rank 4"),
    ("2d", "filters", (5, 4, 3), "filters must be rank 4"),
    ("3d", "input", (6, 7, 8, 3), "input must be rank 5"),
    ("3d", "filters", (3, 4, 2, 3), "filters must be rank 5"),
]


def test_wrong_rank_found_when_run_names_the_operand():
    """Every algorithm; in a fresh process, which TF's kernel would have aborted."""
    code = f"""
    import json
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    ops = {{"1d": tfbigconv.bigconv1d, "2d": tfbigconv.bigconv2d, "3d": tfbigconv.bigconv3d}}
    good = {{"1d": ((2, 40, 3), (9, 3, 4)), "2d": ((2, 17, 19, 3), (5, 4, 3, 4)),
             "3d": ((2, 6, 7, 8, 3), (3, 4, 2, 3, 4))}}
    out = []
    for rank, operand, shape, _ in {WRONG!r}:
        for algorithm in ("auto", "tf", "direct", "fft"):
            f = tf.function(lambda a, b: ops[rank](a, b, 1, "SAME", algorithm=algorithm),
                            input_signature=[tf.TensorSpec(None)] * 2)
            x, w = good[rank]
            x, w = (shape, w) if operand == "input" else (x, shape)
            try:
                f(tf.ones(x), tf.ones(w))
                out.append([rank, operand, algorithm, "no error", ""])
            except Exception as e:
                out.append([rank, operand, algorithm, type(e).__name__, str(e)])
    print(json.dumps(out))
    """
    results = json.loads(run_python(code, TESTS_DIR).strip().splitlines()[-1])
    assert len(results) == 4 * len(WRONG)
    for (rank, operand, algorithm, cls, message), (*_, fragment) in zip(
            results, [c for c in WRONG for _ in range(4)]):
        assert cls == "InvalidArgumentError" and fragment in message, (rank, operand,
                                                                       algorithm, message)


def test_known_wrong_rank_is_refused_when_built():
    """A known rank short of the op's: the op's words, at once."""
    for ours, x_shape, w_shape, fragment in [
            (tfbigconv.bigconv1d, (40, 3), (9, 3, 4), "input must be rank 3"),
            (tfbigconv.bigconv3d, (6, 7, 8, 3), (3, 4, 2, 3, 4), "input must be rank 5"),
            (tfbigconv.bigconv3d, (2, 6, 7, 8, 3), (3, 4, 3, 4), "filters must be rank 5")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=fragment):
            ours(random_case(x_shape, 0), random_case(w_shape, 1), 1, "SAME")
