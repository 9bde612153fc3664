"""memory_report: the saved-for-backward rules against TensorFlow's gradient
functions, the liveness simulation on small hand-checked models, shared
layers, unknown batch, advice, the CLI and explain_oom on a real
ResourceExhaustedError."""
import io
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import func_graph, op_def_registry

import tfbigconv
from tfbigconv import host
from tfbigconv.planning.plan import Verdict
from tfbigconv.cli import main as cli_main
from tfbigconv.memory import report as MR
from tfbigconv.memory.trace import Trace, differentiable
from tfbigconv.memory.workspaces import patch_matrix_bytes
from tfbigconv.memory.rules import CUDNN_WORKSPACE_LIMIT, SAVED_FOR_BACKWARD, VARIADIC_NOTHING
from tfbigconv.text import fmt_bytes
from tfbigconv.planning import planner, tf_rules

F32 = tf.float32


@pytest.fixture
def eigen_kernels(monkeypatch):
    """The report as for TF's CPU kernels without oneDNN (TF_ENABLE_ONEDNN_OPTS=0):
    Conv2D's gradients with their col_buffer (the bench measures that way)."""
    with host.use(host.Host(onednn=False)):
        yield


@pytest.fixture
def onednn_kernels(monkeypatch):
    """The report as for TF running oneDNN, as the probe finds it on an AVX-512
    CPU: Conv2D through oneDNN but for EXPLICIT padding."""
    with host.use(host.Host(onednn=True,
                            onednn_runs=lambda kernel, dtype, explicit, data_format: not explicit)):
        yield


def _ph(shape, dtype=F32):
    return tf.compat.v1.placeholder(dtype, shape)


def _raw(op_type, *inputs, **attrs):
    """tf.raw_ops.<op_type> with its inputs given in op-definition order."""
    names = [a.name for a in op_def_registry.get(op_type).input_arg]
    rename = {"dim": "axis", "reduction_indices": "axis"}  # Python names of ExpandDims, Mean, Sum
    names = [rename.get(n, n) for n in names]
    return getattr(tf.raw_ops, op_type)(**dict(zip(names, inputs)), **attrs)


UNARY = ("Neg", "Square", "Sqrt", "Rsqrt", "Exp", "Log", "Abs", "Erf", "Erfc", "Relu", "Relu6", "Elu",
         "Selu", "LeakyRelu", "Softplus", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Cast",
         "Identity")
BINARY = ("BiasAdd", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum",
          "SquaredDifference")
S1 = [1, 1, 1, 1]


def _build(op_type):
    """Builds one op of op_type on float placeholders; returns it."""
    if op_type in UNARY:
        extra = {"DstT": tf.float64} if op_type == "Cast" else {}
        return _raw(op_type, _ph([2, 3]), **extra).op
    if op_type in BINARY:
        y = _ph([3]) if op_type == "BiasAdd" else _ph([2, 3])
        return _raw(op_type, _ph([2, 3]), y).op
    x4 = _ph([2, 8, 8, 3])
    builders = {
        "Conv2D": lambda: _raw("Conv2D", x4, _ph([3, 3, 3, 4]), strides=S1, padding="SAME"),
        "DepthwiseConv2dNative": lambda: _raw("DepthwiseConv2dNative", x4, _ph([3, 3, 3, 2]),
                                              strides=S1, padding="SAME"),
        "BigConv2D": lambda: tfbigconv.bigconv2d(x4, _ph([3, 3, 3, 4]), 1, "SAME",
                                                 algorithm="direct"),
        "Conv3D": lambda: _raw("Conv3D", _ph([2, 5, 6, 7, 3]), _ph([3, 3, 3, 3, 4]),
                               strides=[1] * 5, padding="SAME"),
        "BigConv3D": lambda: tfbigconv.bigconv3d(_ph([2, 5, 6, 7, 3]), _ph([3, 3, 3, 3, 4]), 1,
                                                 "SAME", algorithm="direct"),
        "Conv2DBackpropInput": lambda: _raw("Conv2DBackpropInput", [2, 8, 8, 3],
                                            _ph([3, 3, 3, 4]), _ph([2, 8, 8, 4]),
                                            strides=S1, padding="SAME"),
        "MatMul": lambda: _raw("MatMul", _ph([3, 4]), _ph([4, 5])),
        "BatchMatMulV2": lambda: _raw("BatchMatMulV2", _ph([2, 3, 4]), _ph([2, 4, 5])),
        "AddN": lambda: tf.raw_ops.AddN(inputs=[_ph([2, 3]), _ph([2, 3])]),
        "FusedBatchNormV3": lambda: tf.raw_ops.FusedBatchNormV3(
            x=x4, scale=_ph([3]), offset=_ph([3]), mean=_ph([0]), variance=_ph([0]),
            is_training=True)[0],
        "MaxPool": lambda: _raw("MaxPool", x4, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1],
                                padding="VALID"),
        "AvgPool": lambda: _raw("AvgPool", x4, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1],
                                padding="VALID"),
        "Mean": lambda: _raw("Mean", _ph([2, 3, 4]), [1]),
        "Sum": lambda: _raw("Sum", _ph([2, 3, 4]), [1]),
        "ResizeNearestNeighbor": lambda: _raw("ResizeNearestNeighbor", x4, [16, 16]),
        "ResizeBilinear": lambda: _raw("ResizeBilinear", x4, [16, 16]),
        "ConcatV2": lambda: tf.raw_ops.ConcatV2(values=[_ph([2, 3]), _ph([2, 3])], axis=1),
        "Pack": lambda: tf.raw_ops.Pack(values=[_ph([2, 3]), _ph([2, 3])], axis=0),
        "Tile": lambda: _raw("Tile", _ph([2, 3]), [2, 1]),
        "Pad": lambda: _raw("Pad", _ph([2, 3]), [[1, 1], [1, 1]]),
        "PadV2": lambda: _raw("PadV2", _ph([2, 3]), [[1, 1], [1, 1]], 0.0),
        "MirrorPad": lambda: _raw("MirrorPad", _ph([4, 5]), [[1, 1], [1, 1]], mode="REFLECT"),
        "Slice": lambda: _raw("Slice", _ph([2, 3]), [0, 1], [2, 2]),
        "StridedSlice": lambda: _raw("StridedSlice", _ph([2, 3]), [0, 1], [2, 3], [1, 1]),
        "Transpose": lambda: _raw("Transpose", _ph([2, 3]), [1, 0]),
        "Reshape": lambda: _raw("Reshape", _ph([2, 3]), [6]),
        "Squeeze": lambda: _raw("Squeeze", _ph([2, 1, 3])),
        "ExpandDims": lambda: _raw("ExpandDims", _ph([2, 3]), 0),
        "DepthToSpace": lambda: _raw("DepthToSpace", _ph([1, 2, 2, 4]), block_size=2),
        "SpaceToDepth": lambda: _raw("SpaceToDepth", _ph([1, 4, 4, 1]), block_size=2),
        "SelectV2": lambda: _raw("SelectV2", _ph([2, 3], tf.bool), _ph([2, 3]), _ph([2, 3])),
        "Split": lambda: tf.raw_ops.Split(axis=1, value=_ph([2, 6]), num_split=3)[0],
        "SplitV": lambda: tf.raw_ops.SplitV(value=_ph([2, 6]), size_splits=[2, 4], axis=1,
                                            num_split=2)[0],
        "ReverseV2": lambda: _raw("ReverseV2", _ph([2, 3]), [1]),
        "RFFT": lambda: _raw("RFFT", _ph([2, 8]), [8]),  # its gradient: unpadded only
        "IRFFT": lambda: _raw("IRFFT", _ph([2, 5], tf.complex64), [8]),
        "IdentityN": lambda: tf.raw_ops.IdentityN(input=[_ph([2, 3]), _ph([2, 3])])[0],
    }
    out = builders[op_type]()
    op = out.op
    while op.type != op_type:  # bigconv2d returns its op's output through name scopes
        op = op.inputs[0].op
    return op


SHAPE_ONLY = ("Shape", "ShapeN", "Size", "Rank")


def _gradient_reads(op_type, index):
    """The float and bool tensors of the op (as "in<i>"/"out<k>") that
    TensorFlow's registered gradient reads as data to compute the gradient of
    input `index` (a bool one: SelectV2's condition)."""
    graph = func_graph.FuncGraph("rule")
    with graph.as_default():
        op = _build(op_type)
        forward = set(graph.get_operations())
        ys = [y for y in op.outputs if differentiable(y.dtype)]
        dys = [_ph(y.shape, y.dtype) for y in ys]
        (dx,) = tf.gradients(ys, [op.inputs[index]], grad_ys=dys)
    if dx is None:
        return None, op
    names = {t.name: f"in{k}" for k, t in enumerate(op.inputs)}
    names.update({t.name: f"out{k}" for k, t in enumerate(op.outputs)})
    reads, stack, seen = set(), [dx.op], set()
    while stack:
        o = stack.pop()
        if o in seen or o in forward or o.type in SHAPE_ONLY:
            continue
        seen.add(o)
        for t in o.inputs:
            if t.name in names:
                if differentiable(t.dtype) or t.dtype == tf.bool:
                    reads.add(names[t.name])
            else:
                stack.append(t.op)
    return reads, op


@pytest.mark.parametrize("op_type", sorted(SAVED_FOR_BACKWARD))
def test_saved_for_backward_rule_matches_tf_gradient(op_type):
    """Each rule names exactly the tensors the registered gradient reads."""
    graph = func_graph.FuncGraph("inputs")
    with graph.as_default():
        op = _build(op_type)
    float_inputs = [i for i, t in enumerate(op.inputs) if differentiable(t.dtype)]
    reads = {i: _gradient_reads(op_type, i)[0] for i in float_inputs}
    with_gradient = [i for i in float_inputs if reads[i] is not None]
    rule = SAVED_FOR_BACKWARD[op_type]
    if op_type in VARIADIC_NOTHING:
        assert rule == {}
    else:
        assert sorted(rule) == with_gradient, "a rule for every input that gets a gradient"
    for i in with_gradient:
        assert reads[i] == set(rule.get(i, ())), (op_type, i, reads[i])


# --- liveness on a hand-checked model -------------------------------------

def _mlp(batch_free=True):
    inp = keras.Input((8,))
    h = keras.layers.Dense(16, use_bias=False, name="d1")(inp)
    h = keras.layers.ReLU(name="act")(h)
    return keras.Model(inp, keras.layers.Dense(1, use_bias=False, name="d2")(h))


def test_liveness_hand_checked_mlp():
    """x(B,8) -> MatMul h(B,16) -> Relu r(B,16) -> MatMul y(B,1) -> MSE loss.

    Relu writes r into h's buffer (nothing else reads h). The peak is d2's
    MatMul gradient: r (kept by Relu and by d2's MatMul), dL/dy (B,1, the
    loss's Sub gradient, which y's passes through), dL/dr being made, and
    d2's kernel gradient (16x1). ReluGrad then writes dL/dh into dL/dr.
    """
    model = _mlp()
    for b in (100, 1000):
        r = tfbigconv.memory_report(model, b, advice=False, device="CPU")
        act = 16 * 4 * b
        assert r.step_peak_bytes == 2 * act + 4 * b + 16 * 4
        assert r.param_bytes == (8 * 16 + 16) * 4 and r.slot_bytes == 0
        assert r.peak_bytes == r.step_peak_bytes + r.param_bytes + 8 * 4 * b  # + the batch x
        assert (r.peak_step.phase, r.peak_step.layer) == ("backward", "d2")
        alive = sorted((a.bytes, a.what) for a in r.alive_at_peak)
        assert alive == sorted([(act, "Relu output"), (act, "gradient of Relu output"),
                                (4 * b, "gradient of Sub output"),
                                (64, "gradient of d2/kernel")])
        relu_grad = next(s for s in r.timeline.steps if s.op.endswith("act_1/Relu/grad"))
        assert relu_grad.total - r.persistent_bytes() == 2 * act + 64


def _spectral_model(length, channels):
    """Dense on a sequence, then Hyena's FFT causal convolution with a weight k
    [L, d]: rfft of length 2L (padded to a length from tf.shape), multiply,
    irfft, crop."""
    class SpectralConv(keras.layers.Layer):
        def build(self, input_shape):
            self.k = self.add_weight(shape=(length, channels), name="k")

        def call(self, u):
            n = 2 * tf.shape(u)[1]
            u_f = tf.signal.rfft(tf.transpose(u, [0, 2, 1]), fft_length=[n])
            k_f = tf.signal.rfft(tf.transpose(self.k), fft_length=[n])
            y = tf.signal.irfft(u_f * k_f, fft_length=[n])[..., :length]
            return tf.transpose(y, [0, 2, 1])

    inp = keras.Input((length, channels))
    h = keras.layers.Dense(channels, use_bias=False, name="proj")(inp)
    return keras.Model(inp, SpectralConv(name="spectral")(h))


def test_liveness_hand_checked_fft_long_convolution():
    """Gradients flow through complex tensors, and the sizes shape inference
    knows are used. The peak is the gradient of the input's RFFT (u_f): its
    incoming gradient dL/du_f (complex [B, d, L+1]), the gradient being made
    (of the padded input, real [B, d, 2L]), its Hermitian-terms temporary
    (complex64 and its real part: 12 bytes per element of [B, d, 2L]), the
    gradient of the padded k (real [d, 2L]: k_f's RFFT gradient, ready with
    u_f's, ran first) and Dense's input, kept for its kernel's gradient."""
    length, d, b = 64, 8, 4
    model = _spectral_model(length, d)
    r = tfbigconv.memory_report(model, b, advice=False, device="CPU")
    spectrum, padded = 8 * b * d * (length + 1), 4 * b * d * 2 * length
    alive = sorted((a.bytes, a.what) for a in r.alive_at_peak)
    assert alive == sorted([
        (3 * padded, "RFFT's gradient: the Hermitian terms (complex64) and their real part"),
        (spectrum, "gradient of RFFT output"), (padded, "gradient of Pad output"),
        (4 * b * length * d, "Transpose output"),
        (4 * d * 2 * length, "gradient of Pad output")])
    assert (r.peak_step.phase, r.peak_step.layer) == ("backward", "spectral")
    assert r.peak_step.op.endswith("/rfft/grad")
    trace = Trace(model)
    by_type = {}
    for op in trace.ops:
        by_type.setdefault(op.type, []).append(op)
    # The spectra's product keeps both spectra (complex64) for its gradients.
    (product,) = [op for op in by_type["Mul"] if trace.tensors[op.outputs[0]].dtype.is_complex]
    assert sorted(trace.tensors[n].bytes(b) for n in trace.saved(product)[0]) == \
        [8 * d * (length + 1), spectrum]
    # Keras 3's Dense on a sequence multiplies a [B * L, d] matrix: not [B, d].
    (matmul,) = by_type["MatMul"]
    assert trace.tensors[matmul.outputs[0]].bytes(b) == 4 * b * length * d


def test_inference_keeps_nothing_for_backward():
    model = _mlp()
    r = tfbigconv.memory_report(model, 100, training=False, advice=False, device="CPU")
    # Forward only: the Relu writes r into h's buffer; r and y (B,1) are alive
    # at d2's MatMul; no gradients.
    assert r.step_peak_bytes == 16 * 4 * 100 + 4 * 100
    assert r.peak_step.phase == "forward"
    assert all(row.kept_bytes == 0 and row.grad_bytes == 0 for row in r.rows)


def test_optimizer_slots_and_unknown_batch():
    """An unknown (None) batch: any batch size can be reported; the step's
    memory is exactly linear in the batch here (no workspace), and Adam adds
    two slots per trainable weight."""
    model = _mlp()
    r3 = tfbigconv.memory_report(model, 30, optimizer="adam", advice=False, device="CPU")
    r7 = tfbigconv.memory_report(model, 70, optimizer=keras.optimizers.Adam(), advice=False,
                                 device="CPU")
    assert r3.slot_bytes == 2 * r3.param_bytes
    assert (r7.step_peak_bytes - 64) * 3 == (r3.step_peak_bytes - 64) * 7
    assert r3.rows[0].output_shape == [30, 16] and r7.rows[0].output_shape == [70, 16]
    assert r3.peak_at(70) == r7.peak_bytes


def test_shared_layer_counts_weights_once_and_activations_per_call():
    inp = keras.Input((8,))
    shared = keras.layers.Dense(8, name="shared")
    h = shared(keras.layers.ReLU(name="r0")(inp))
    h = keras.layers.ReLU(name="r1")(h)
    out = shared(h)
    model = keras.Model(inp, out)
    r = tfbigconv.memory_report(model, 50, advice=False, device="CPU")
    layer_rows = [row for row in r.rows if not row.op and row.layer.startswith("shared")]
    assert [row.layer for row in layer_rows] == ["shared", "shared (call 2)"]
    assert layer_rows[0].param_bytes == (64 + 8) * 4 and layer_rows[1].param_bytes == 0
    assert r.param_bytes == (64 + 8) * 4
    assert all(row.output_shape == [50, 8] for row in layer_rows)
    # The second call's MatMul keeps r1's output; the first call's keeps r0's.
    assert layer_rows[0].kept_bytes == layer_rows[1].kept_bytes == 50 * 8 * 4


def test_subclassed_model_needs_input_shape():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv = keras.layers.Conv2D(4, 3, padding="same", activation="relu")

        def call(self, x):
            return self.conv(x)

    net = Net()
    net(np.zeros((1, 16, 16, 2), np.float32))
    with pytest.raises(ValueError, match="input_shape"):
        tfbigconv.memory_report(net, 2, advice=False)
    r = tfbigconv.memory_report(net, 2, input_shape=(16, 16, 2), advice=False, device="CPU")
    assert any(row.op == "Conv2D" and row.output_shape == [2, 16, 16, 4] for row in r.rows)


def test_bad_arguments():
    model = _mlp()
    for kwargs in ({"batch_size": 0}, {"batch_size": 2.0}, {"batch_size": 2, "device": "TPU"},
                   {"batch_size": 2, "budget": -1}):
        with pytest.raises(ValueError):
            tfbigconv.memory_report(model, **kwargs)
    with pytest.raises(ValueError, match="Keras model"):
        tfbigconv.memory_report("model", 2)


# --- convolutions, advice --------------------------------------------------

def _bigfilter_model():
    inp = keras.Input((48, 48, 1))
    h = keras.layers.Conv2D(3, 3, padding="same", activation="relu", name="small")(inp)
    return keras.Model(inp, keras.layers.Conv2D(2, 25, name="big")(h))


def test_conv_workspaces_come_from_the_planner(eigen_kernels):
    model = _bigfilter_model()
    r = tfbigconv.memory_report(model, 4, device="CPU", advice=False)
    row = next(row for row in r.rows if row.layer == "big" and row.op == "Conv2D")
    attrs = dict(strides=[1, 1, 1, 1], padding="VALID", explicit_paddings=[],
                 data_format="NHWC", dilations=[1, 1, 1, 1])
    ws = {p: planner.plan(p, [4, 48, 48, 3], [25, 25, 3, 2], attrs, "float32", "auto", 0)
          for p in planner.PASSES}
    # TF's CPU gradient kernels' col_buffer, as the planner estimates it: the
    # filter gradient's holds all 4 images, the input gradient's one
    # (tests/test_plan.py checks the rule).
    assert row.tf_workspace == (ws["forward"].tf.workspace_bytes,
                                ws["backprop_input"].tf.workspace_bytes
                                + ws["backprop_filter"].tf.workspace_bytes)
    assert ws["forward"].tf.workspace_bytes == 0  # Eigen's forward builds no patch matrix
    assert ws["backprop_filter"].tf.workspace_bytes == 4 * patch_matrix_bytes(
        ws["forward"].geometry, "float32")
    # tfbigconv plans an unknown batch as ASSUMED_BATCH images, then runs that
    # algorithm on the real batch.
    def chosen(p):
        algorithm = planner.plan(p, [planner.ASSUMED_BATCH, 48, 48, 3], [25, 25, 3, 2], attrs,
                                  "float32", "auto", 0).chosen
        return planner.plan(p, [4, 48, 48, 3], [25, 25, 3, 2], attrs, "float32", algorithm,
                             0).estimate(algorithm).workspace_bytes

    assert row.bigconv_workspace == (chosen("forward"),
                                     chosen("backprop_input") + chosen("backprop_filter"))
    # TF's patch matrix is the largest thing alive at the peak.
    assert r.alive_at_peak[0].what.startswith("workspace of Conv2D's gradient")



@pytest.mark.native
def test_a_fused_backward_counts_one_workspace():
    """A long causal BigDepthwiseConv1D whose two gradients plan as fft on the CPU
    runs them as one BigConv2DBackprop op: its backward workspace is that op's
    plan, not the sum of the two passes' plans."""
    inp = keras.Input((300, 16))
    layer = tfbigconv.keras.BigDepthwiseConv1D(200, padding="causal", algorithm="fft", name="long")
    # A layer before it, so that its input needs a gradient too.
    model = keras.Model(inp, layer(keras.layers.Dense(16)(inp)))
    r = tfbigconv.memory_report(model, 2, device="CPU", advice=False)
    row = next(row for row in r.rows if row.layer == "long" and row.op == "BigConv2D")
    attrs = dict(strides=[1, 1, 1, 1], padding="EXPLICIT",
                 explicit_paddings=[0, 0, 0, 0, 199, 0, 0, 0], data_format="NHWC",
                 dilations=[1, 1, 1, 1])
    fused = planner.fused_backward([2, 1, 300, 16], [1, 200, 1, 16], attrs, "float32", "CPU")
    separate = sum(planner.plan(p, [2, 1, 300, 16], [1, 200, 1, 16], attrs, "float32", "fft", 0)
                   .fft.workspace_bytes for p in planner.PASSES[1:])
    assert fused and fused.workspace_bytes != separate
    assert row.bigconv_workspace[1] == fused.workspace_bytes


def test_a_tf_ops_gradient_workspace_is_its_own_kernels(eigen_kernels):
    """tf.nn.conv2d with a dilated depthwise filter is TF's grouped Conv2D,
    whose registered gradients run Conv2DBackprop* (col_buffer), not the
    depthwise kernels bigconv2d plans for such filters (SpaceToBatchND)."""
    class Atrous(keras.layers.Layer):  # Keras' own grouped Conv2D hides it in a function call
        def build(self, shape):
            self.w = self.add_weight(shape=(3, 3, 1, 8))

        def call(self, x):
            return tf.nn.conv2d(x, self.w, 1, "SAME", dilations=2)

    inp = keras.Input((32, 32, 8))
    model = keras.Model(inp, Atrous(name="atrous")(keras.layers.Conv2D(8, 1)(inp)))
    r = tfbigconv.memory_report(model, 2, device="CPU", advice=False)
    row = next(row for row in r.rows if row.layer == "atrous" and row.op == "Conv2D")
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[],
                 data_format="NHWC", dilations=[1, 2, 2, 1])
    args = ([2, 32, 32, 8], [3, 3, 1, 8], attrs, "float32", "tf", 0, "CPU")
    ws = {p: planner.plan(p, *args, kernel="Conv2D").tf.workspace_bytes
          for p in planner.PASSES}
    planned = [planner.plan(p, *args).tf for p in planner.PASSES[1:]]
    assert [p.workspace_bytes for p in planned] != [ws[p] for p in planner.PASSES[1:]]
    assert row.tf_workspace == (ws["forward"], ws["backprop_input"] + ws["backprop_filter"])

def test_gpu_report_needs_no_gpu():
    """device="GPU": cuDNN's workspace is estimated as TF's patch matrix (one
    image), capped at TF's cuDNN limit; tfbigconv's plan is the GPU planner's."""
    r = tfbigconv.memory_report(_bigfilter_model(), 4, device="GPU", advice=False)
    row = next(row for row in r.rows if row.layer == "big" and row.op == "Conv2D")
    attrs = dict(strides=[1, 1, 1, 1], padding="VALID", explicit_paddings=[],
                 data_format="NHWC", dilations=[1, 1, 1, 1])
    patch = patch_matrix_bytes(planner.plan("forward", [4, 48, 48, 3], [25, 25, 3, 2], attrs,
                                            "float32", "tf", 0).geometry, "float32")
    assert row.tf_workspace[0] == min(patch, CUDNN_WORKSPACE_LIMIT) == 24 * 24 * 25 * 25 * 3 * 4
    assert "device GPU" in str(r)
    assert "estimates" in str(r) and "not been checked against measured GPU peaks" in str(r)
    assert not any("GPU" in n for n in tfbigconv.memory_report(_bigfilter_model(), 4,
                                                               device="CPU", advice=False).notes)


def test_advice_conversion_batch_and_mixed_precision(eigen_kernels):
    model = _bigfilter_model()
    r = tfbigconv.memory_report(model, 4, device="CPU", budget=64 << 20)
    each, together, helping = r.conversion_effect()
    assert [layer.name for layer in helping] == ["big"]
    assert together < r.peak_bytes
    converted = tfbigconv.memory_report(tfbigconv.convert_model(model, min_kernel_size=15), 4,
                                        device="CPU", advice=False)
    assert converted.peak_bytes == together  # the same simulation as the real conversion
    fits = r.max_batch_size(64 << 20)
    assert 1.2 * r.peak_at(fits) <= 64 << 20 < 1.2 * r.peak_at(fits + 1)  # 20% kept in reserve
    assert r.max_batch_size(64 << 20, margin=0) >= fits
    fixed, each = r.per_example_bytes(fits)
    assert fixed + (fits + 1) * each == r.peak_at(fits + 1)
    text = str(r)
    assert "convert_model: converting big (25x25) lowers the peak" in text
    assert f"largest batch within 64.0 MiB: {fits}" in text
    assert "mixed precision (mixed_bfloat16)" in text


def test_recompute_advice_frees_a_layers_internal_tensors():
    """A layer whose own ops keep big tensors (GELU's erf and products inside
    a Dense layer): under tf.recompute_grad they are made again in the
    backward pass, so the peak drops."""
    inp = keras.Input((64,))
    h = inp
    for i in range(4):
        h = keras.layers.Dense(64, activation="gelu", name=f"d{i}")(h)
    model = keras.Model(inp, keras.layers.Dense(1, name="out")(h))
    r = tfbigconv.memory_report(model, 1024, device="CPU", advice=False)
    effect = dict((call.label, peak) for call, peak in r.recompute_effect())
    assert min(effect.values()) < r.peak_bytes
    assert set(effect) >= {"d0", "d1", "d2", "d3"}


# --- CLI and explain_oom ---------------------------------------------------

def test_cli_memory(tmp_path, capsys):
    main = cli_main
    path = str(tmp_path / "m.keras")
    model = _bigfilter_model()
    model.compile(optimizer="adam", loss="mse")
    model.save(path)
    assert main(["memory", path, "--batch", "4", "--budget", "64M", "--device", "CPU"]) == 0
    out = capsys.readouterr().out
    expected = tfbigconv.memory_report(keras.models.load_model(path), 4, device="CPU",
                                       budget=64 << 20, advice=False)
    assert "optimizer Adam (2 slots per weight)" in out
    assert f"Peak: {fmt_bytes(expected.peak_bytes)} = " in out
    assert f"largest batch within 64.0 MiB: {expected.max_batch_size()}" in out
    assert main(["memory", path, "--batch", "0"]) == 2


def test_explain_oom_on_a_real_resource_exhausted_error():
    inp = keras.Input((40, 40, 1))
    big = tfbigconv.keras.BigConv2D(2, 15, algorithm="fft", workspace_limit=1024, name="tight")
    model = keras.Model(inp, big(inp))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).standard_normal((2, 40, 40, 1)).astype(np.float32)
    y = np.zeros((2, 26, 26, 2), np.float32)
    out = io.StringIO()
    explainer = tfbigconv.explain_oom(model, 2, budget=1 << 30, file=out)
    with pytest.raises(tf.errors.ResourceExhaustedError) as caught:
        with explainer:
            model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    assert "workspace" in str(caught.value)  # the op's own message, unchanged
    text = out.getvalue()
    summary = text.splitlines()[0]
    # The cause is the layer's workspace_limit, not the memory: no batch advice.
    assert "ResourceExhaustedError at batch 2 is a tfbigconv workspace_limit" in summary
    assert "tight does not fit its workspace_limit of 1024 bytes" in summary
    assert "largest batch that fits" not in summary
    assert "a smaller batch does not help" in summary  # the FFT's one tile, whatever the batch
    assert "tight, forward (fft)" in text  # the note naming the layer that cannot fit
    assert explainer.report is not None and explainer.report.batch_size == 2
    # Other errors pass through without a report.
    out2 = io.StringIO()
    with pytest.raises(KeyError):
        with tfbigconv.explain_oom(model, 2, file=out2):
            raise KeyError("x")
    assert out2.getvalue() == ""


@pytest.mark.native
def test_explain_oom_on_a_workspace_limit_names_the_limit_and_what_fits():
    """explain_oom advised "largest batch that fits: 8401" after a layer's
    workspace_limit raised, which more memory or a smaller budget never
    fixes. Its summary now names the layer, the pass and the planner's
    message, says auto fits the limit, and gives the largest batch within the
    limit; fit runs at that batch and raises at the next."""
    inp = keras.Input((40, 40, 4))
    big = tfbigconv.keras.BigConv2D(8, 15, algorithm="direct", workspace_limit=200000,
                                    name="tight")
    model = keras.Model(inp, big(inp))
    model.compile(optimizer="sgd", loss="mse")

    def fit(b):
        x = np.random.default_rng(0).standard_normal((b, 40, 40, 4)).astype(np.float32)
        model.fit(x, np.zeros((b, 26, 26, 8), np.float32), batch_size=b, epochs=1, verbose=0)

    out = io.StringIO()
    with pytest.raises(tf.errors.ResourceExhaustedError) as caught:
        with tfbigconv.explain_oom(model, 8, budget=1 << 30, file=out) as explainer:
            fit(8)
    summary = out.getvalue().splitlines()[0]
    assert "at batch 8 is a tfbigconv workspace_limit, not the memory" in summary
    failures = explainer.report.workspace_limit_failures()
    raised = [f for f in failures if f.message in caught.value.message]
    assert raised and all(f.layer == "tight" and f.algorithm == "direct" for f in raised)
    assert all(f"{f.pass_} (direct): {f.message}" in summary for f in raised)
    assert 'use algorithm="auto", which fits the limit' in summary
    assert "largest batch that fits" not in summary
    n = int(re.search(r"the largest batch within the limits is (\d+)", summary).group(1))
    assert 1 <= n < 8
    fit(n)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        fit(n + 1)
    # The report's advice says the same first.
    assert explainer.report.advice[0].startswith("workspace_limit: tight does not fit")
    # An out-of-memory error that is not the limit's keeps the batch advice.
    out2 = io.StringIO()
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with tfbigconv.explain_oom(model, 2, budget=1 << 30, file=out2):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    assert "largest batch that fits:" in out2.getvalue().splitlines()[0]


def test_inference_under_mixed_precision_has_no_loss_ops():
    """training=False under mixed_float16 counted the loss's Casts and Sub
    (three tensors of the output's size in float32) and put the peak there,
    so the inference advice said mixed precision raises the peak (+48%)."""
    def model():
        return keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Conv2D(8, 3, name="conv")])

    full = tfbigconv.memory_report(model(), 16, training=False, advice=False, device="CPU")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = tfbigconv.memory_report(model(), 16, training=False, advice=False,
                                        device="CPU")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for r in (full, mixed):
        assert r.peak_step.phase == "forward" and r.peak_step.layer == "conv"
        assert all(a.layer != "(loss)" for a in r.alive_at_peak)
    out = 16 * 62 * 62 * 8
    # The conv's output, 2 bytes an element under mixed_float16 (BiasAdd writes
    # into its buffer).
    assert [a.bytes for a in mixed.alive_at_peak if a.shape == [16, 62, 62, 8]] == [2 * out]
    assert mixed.peak_bytes < full.peak_bytes
    # The float32 model's advice: its mixed-precision clone lowers the peak.
    advice = tfbigconv.memory_report(model(), 16, training=False, device="CPU",
                                     budget=1 << 30).advice
    line = next(a for a in advice if a.startswith("mixed precision ("))
    assert re.search(r"\(-\d+%\)$", line), line
    # Training still counts the loss (its gradient starts there).
    train = tfbigconv.memory_report(model(), 16, advice=False, device="CPU")
    assert train.peak_bytes > full.peak_bytes


# --- the report's trace plans without timing, in its own thread only -------

def _trace_tight_bigconv():
    """Traces a 135x135 bigconv2d whose workspace_limit nothing fits: the planner raises."""
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, tf.ones([135, 135, 1, 3]), 1, "VALID",
                                                  workspace_limit=1024))
    f.get_concrete_function(tf.TensorSpec([1, 200, 200, 1]))


def test_planning_only_holds_for_the_reports_trace_alone(monkeypatch):
    """While a report traces a model, another thread traces bigconv2d: that
    trace plans as usual (it raises, nothing fitting its limit), and its
    failure does not reach the report. A global switch of planner.decide, as
    memory_report once used, fails both checks."""
    import threading
    # TF's kernel out of auto's reach: oneDNN's forward needs no workspace and would
    # fit any limit, where ours do not.
    monkeypatch.setattr(tf_rules, "tf_kernel",
                        lambda *a, **k: ("", Verdict.NEVER, "left out by this test"))
    with pytest.raises(tf.errors.ResourceExhaustedError):
        _trace_tight_bigconv()  # outside any report
    tracing, other_done = threading.Event(), threading.Event()
    seen = {}

    class Pause(keras.layers.Layer):
        armed = False  # building the model calls it too

        def call(self, x):
            if Pause.armed:
                tracing.set()
                assert other_done.wait(120)
            return x

    def other_thread():
        assert tracing.wait(120)
        try:
            _trace_tight_bigconv()
            seen["error"] = None
        except tf.errors.ResourceExhaustedError as e:
            seen["error"] = e
        finally:
            other_done.set()

    inp = keras.Input((16, 16, 1))
    model = keras.Model(inp, keras.layers.Conv2D(2, 3)(Pause()(inp)))
    Pause.armed = True
    thread = threading.Thread(target=other_thread)
    thread.start()
    r = tfbigconv.memory_report(model, 2, device="CPU", advice=False)
    thread.join()
    assert isinstance(seen["error"], tf.errors.ResourceExhaustedError)
    assert not any("workspace_limit" in n for n in r.notes)
    with planner.planning_only() as failures:  # the report's own mode, in this thread
        _trace_tight_bigconv()
    assert len(failures) == 1 and "limit" in failures[0]


def test_custom_gradient_identity_n_shares_its_inputs_buffers():
    """tf.custom_gradient wraps an op's outputs in IdentityN, which forwards its
    inputs' buffers. Counted as new tensors, they put the subtracted-conv block's
    converted step (bench_memory_report.py) at +28% of its measured peak."""
    L = keras.layers
    inp = keras.Input((128, 128, 8))
    p = L.Conv2D(16, 1)(inp)
    d = L.DepthwiseConv2D(15, padding="same")(p)
    low = L.Conv2D(16, 15, padding="same")(inp)
    out = L.Conv2D(8, 1)(L.Concatenate()([L.Subtract()([d, low]), inp]))
    model = tfbigconv.convert_model(keras.Model(inp, out), min_kernel_size=1)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    r = tfbigconv.memory_report(model, 2, advice=False, device="CPU")
    # The first 1x1 conv runs TF's Conv2D forward and one of our kernels for a
    # gradient: custom_gradient routes them, through an IdentityN.
    identity_n = [row for row in r.rows if row.op == "IdentityN"]
    assert identity_n
    assert not [a for a in r.alive_at_peak if a.what.startswith("IdentityN output")]


def test_routed_gradients_are_counted_as_the_planner_runs_them(monkeypatch, model,
                                                              eigen_kernels):
    """bigconv2d may run TF's forward kernel with its own gradient plan (routed
    by tf.custom_gradient). The report used to charge TF's gradient
    workspaces for them: unet's converted step at +94% of its measured peak
    (bench_memory_report.py). Here TF's forward is made the planner's choice
    and TF's gradients unavailable to auto."""
    model("im2col_flops_per_second", 100)
    real = tf_rules.tf_kernel

    def no_tf_gradients(pass_, *args):
        kernel, for_auto, note = real(pass_, *args)
        return (kernel, for_auto, note) if pass_ == "forward" else (kernel, "never", "test")

    monkeypatch.setattr(tf_rules, "tf_kernel", no_tf_gradients)
    inp = keras.Input((64, 64, 96))
    out = keras.layers.Conv2D(32, 3, padding="same", name="c")(inp)
    converted = tfbigconv.convert_model(keras.Model(inp, out), min_kernel_size=1)
    r = tfbigconv.memory_report(converted, 2, advice=False, device="CPU")
    ops = {row.op for row in r.rows if row.layer == "c"}
    assert {"Conv2D", "IdentityN"} <= ops, ops  # TF's forward, routed gradients
    # Charged TF's gradient workspaces (13.5 + 27 MiB), the step would peak in
    # the backward pass above TF's filter-gradient col_buffer alone; with the
    # planner's kernels (about 1 MiB) it peaks at TF's forward patch matrix.
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[],
                 data_format="NHWC", dilations=[1, 1, 1, 1])
    tf_bpf = planner.plan("backprop_filter", [2, 64, 64, 96], [3, 3, 96, 32], attrs,
                           "float32", "tf", 0).tf.workspace_bytes
    assert r.step_peak_bytes < tf_bpf, (r.step_peak_bytes, tf_bpf, r.peak_step)
    assert not any("gradient" in a.what and "tf.Conv2D" in a.what for a in r.alive_at_peak)


# --- oneDNN's kernels (issue 36) --------------------------------------------

def test_onednn_conv_kernels_hold_no_patch_matrices(onednn_kernels):
    """Where TF runs Conv2D through oneDNN (its default here), the graph's Conv2D
    and its gradients become _MklNativeConv2D* ops that allocate their outputs
    and no col_buffer: TF's allocator log of U-Net-style steps showed none, and
    the report, which charged the Eigen kernels' col_buffer, predicted 113.8
    MiB at batch 2 for a step whose tensors peaked at 34.9 MiB
    (bench_memory_report.py unet_bn --onednn). EXPLICIT padding still runs TF's
    Eigen kernels (the planner's probe, tf_cpu_onednn)."""
    r = tfbigconv.memory_report(_bigfilter_model(), 4, device="CPU", advice=False)
    row = next(row for row in r.rows if row.layer == "big" and row.op == "Conv2D")
    assert row.tf_workspace == (0, 0)
    assert not any("tf.Conv2D" in a.what for a in r.alive_at_peak)
    assert any("its Conv2D kernels hold no patch matrices" in n for n in r.notes)

    class Explicit(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(3, 3, 8, 8))

        def call(self, x):
            return tf.nn.conv2d(x, self.w, 1, [[0, 0], [1, 1], [1, 1], [0, 0]])

    inp = keras.Input((32, 32, 8))
    model = keras.Model(inp, Explicit(name="explicit")(keras.layers.Conv2D(8, 1)(inp)))
    r = tfbigconv.memory_report(model, 2, device="CPU", advice=False)
    row = next(row for row in r.rows if row.layer == "explicit" and row.op == "Conv2D")
    assert row.tf_workspace[1] > 0


def test_onednn_maxpool_keeps_its_workspace_until_its_gradient(onednn_kernels, monkeypatch):
    """With oneDNN, TF rewrites a MaxPool whose gradient is in the graph to
    _MklNativeMaxPool(workspace_enabled=true): a second output, one uint8 per
    output element for windows up to 255, that MaxPoolGrad reads (measured: 1.0
    MiB of DT_UINT8 for a 16x64x64x16 pool output). It lives from the forward
    pass until the pool's gradient, here across the peak at c2's gradient (or
    the upsampling's, which runs while c2's filter gradient still does)."""
    def model():
        inp = keras.Input((64, 64, 4))
        h = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="c1")(inp)
        h = keras.layers.MaxPooling2D(name="pool")(h)
        h = keras.layers.UpSampling2D(4, name="up")(h)
        return keras.Model(inp, keras.layers.Conv2D(4, 3, padding="same", name="c2")(h))

    ws = 4 * 32 * 32 * 16
    r = tfbigconv.memory_report(model(), 4, device="CPU", advice=False)
    assert r.peak_step.phase == "backward" and r.peak_step.layer in ("c2", "up")
    assert [a.bytes for a in r.alive_at_peak if a.what == "oneDNN MaxPool workspace"] == [ws]
    assert any("MaxPool keeps a workspace" in n for n in r.notes)
    inference = tfbigconv.memory_report(model(), 4, device="CPU", advice=False, training=False)
    assert not any("workspace" in a.what and "MaxPool" in a.what
                   for a in inference.alive_at_peak)
    monkeypatch.setattr(MR, "onednn_maxpool_workspace", lambda op: 0)
    without = tfbigconv.memory_report(model(), 4, device="CPU", advice=False)
    assert r.step_peak_bytes - without.step_peak_bytes == ws
    pool = lambda report: next(row for row in report.rows if row.layer == "pool" and not row.op)
    assert pool(r).kept_bytes - pool(without).kept_bytes == ws


def test_tf_maxpool_gradient_counts_its_argmax():
    """TF's own MaxPoolGrad (oneDNN off) fills an int64 argmax of the pool
    output's shape while it runs (allocator log: 1.0 MiB DT_INT64 for an
    8x32x32x16 output); oneDNN's keeps its uint8 workspace from the forward
    pass instead."""
    def model():
        inp = keras.Input((64, 64, 8))
        h = keras.layers.Conv2D(8, 1, name="c")(inp)
        return keras.Model(inp, keras.layers.MaxPooling2D(name="pool")(h))

    out = 4 * 32 * 32 * 8
    for onednn, argmax, workspace in ((False, [8 * out], []), (True, [], [out])):
        with host.use(host.Host(onednn=onednn, workers=1,
                                onednn_runs=lambda kernel, dtype, explicit, fmt: not explicit)):
            r = tfbigconv.memory_report(model(), 4, device="CPU", advice=False)
        assert (r.peak_step.phase, r.peak_step.layer) == ("backward", "pool")
        assert [a.bytes for a in r.alive_at_peak if "argmax" in a.what] == argmax
        assert [a.bytes for a in r.alive_at_peak if a.what == "oneDNN MaxPool workspace"] \
            == workspace


def test_a_filter_gradient_runs_beside_its_input_gradients_consumers():
    """Issue 52: TF's executor runs a conv's filter gradient, which nothing in
    the backward pass waits for, on another thread while the input gradient's
    consumers run; it holds the conv's input and incoming gradient meanwhile
    (allocator log of a U-Net step: the concatenation's output alive through
    the concat's and upsampling's gradients). With one worker the ops run one
    at a time."""
    def model():
        inp = keras.Input((32, 32, 4))
        c1 = keras.layers.Conv2D(8, 3, padding="same", name="c1")(inp)
        h = keras.layers.Concatenate(name="cat")([c1, inp])
        h = keras.layers.Conv2D(4, 3, padding="same", name="c2")(h)
        return keras.Model(inp, keras.layers.MaxPooling2D(name="pool")(h))

    reports = {}
    for workers in (1, 2):
        with host.use(host.Host(onednn=True, workers=workers,
                                onednn_runs=lambda kernel, dtype, explicit, fmt: not explicit)):
            reports[workers] = tfbigconv.memory_report(model(), 8, device="CPU", advice=False)
    one, two = reports[1], reports[2]
    cat, c1_grad, c2_grad = 8 * 32 * 32 * 12 * 4, 8 * 32 * 32 * 8 * 4, 8 * 32 * 32 * 4 * 4
    assert (one.peak_step.layer, two.peak_step.layer) == ("c2", "cat")
    # One worker: c2's gradients done, its input and incoming gradient freed
    # before the concat's gradient; two: both still held by c2's filter gradient.
    alive = lambda r: sorted(a.bytes for a in r.alive_at_peak if a.bytes >= c2_grad)
    assert alive(one) == [c2_grad, cat, cat]
    assert alive(two) == [c2_grad, c1_grad, cat, cat]
    assert two.step_peak_bytes - one.step_peak_bytes == c1_grad


# --- advice that adds up (issue 36) -------------------------------------------

def _conv135():
    inp = keras.Input((321, 481, 1))
    return keras.Model(inp, keras.layers.Conv2D(3, 135, name="conv")(inp), name="conv135")


def test_growth_line_adds_up_at_the_reports_batch(eigen_kernels):
    """At batch 2 the 135x135 step peaks at TF's 4.4 GiB filter-gradient
    col_buffer; at the largest batch within 20 GiB, activations decide. The
    advice once put "the peak is 640.8 KiB + 2.8 MiB per example" (the line
    near batch 6058) beside "Peak: 4.4 GiB" at batch 2. Now its numbers add up
    at the batch they name, and it says when the peak is not affine."""
    r = tfbigconv.memory_report(_conv135(), 2, device="CPU", optimizer="adam",
                                budget=20 << 30)
    fixed, each = r.per_example_bytes(2)
    assert fixed + 2 * each == r.peak_bytes
    fits = r.max_batch_size()
    fixed_n, each_n = r.per_example_bytes(fits)
    assert fixed_n + fits * each_n == r.peak_at(fits)
    assert abs(fixed + fits * each - r.peak_at(fits)) > 0.01 * r.peak_at(fits)  # not affine
    line = next(line for line in r.advice if line.startswith("largest batch within 20.0 GiB"))
    assert "not affine in the batch" in line
    assert (f"{fmt_bytes(fixed)} + {fmt_bytes(each)} per example near batch 2 "
            f"({fmt_bytes(r.peak_bytes)} at 2)") in line
    assert (f"{fmt_bytes(fixed_n)} + {fmt_bytes(each_n)} per example near batch {fits} "
            f"({fmt_bytes(r.peak_at(fits))} at {fits})") in line
    # Where one line holds from the report's batch to the budget's, it is given once.
    text = r.growth_text(8)
    assert text == (f"the peak is {fmt_bytes(fixed)} + {fmt_bytes(each)} per example near "
                    f"batch 2 ({fmt_bytes(r.peak_bytes)} at 2), and "
                    f"{fmt_bytes(r.peak_at(8))} at 8")


def test_explain_oom_summary_and_advice_give_one_largest_batch(monkeypatch):
    """Without a budget both use the free memory, which moves as the process
    allocates: read once for the advice and again for the summary, they said
    6158 and 6144. Now the report reads it once and both use batch_fit()."""
    calls = iter(range(1000))
    monkeypatch.setattr(MR, "free_memory", lambda device: (1 << 30) - next(calls) * (8 << 20))
    out = io.StringIO()
    explainer = tfbigconv.explain_oom(_bigfilter_model(), 4, file=out)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with explainer:
            raise tf.errors.ResourceExhaustedError(None, None, "out of memory")
    text = out.getvalue()
    summary = re.search(r"largest batch that fits: (\d+) \(within 1\.0 GiB\)", text)
    advice = re.search(r"largest batch within 1\.0 GiB: (\d+)", text)
    assert summary and advice, text
    assert summary.group(1) == advice.group(1)
    assert explainer.report.max_batch_size() == int(advice.group(1))


def test_max_batch_size_says_why_when_not_even_one_example_fits(eigen_kernels):
    """max_batch_size(5 GiB) of the 135x135 step returned 0 silently: batch 1
    peaks at 4.4 GiB (TF's filter-gradient col_buffer, whatever the batch), 5.3
    GiB with the 20% margin. It still returns 0 (an int, as callers use it) and
    warns why; the advice says the same instead of "largest batch ...: 0"."""
    r = tfbigconv.memory_report(_conv135(), 2, device="CPU", optimizer="adam", budget=5 << 30)
    with pytest.warns(UserWarning, match="not even batch 1 fits 5.0 GiB") as caught:
        assert r.max_batch_size() == 0
    message = str(caught[0].message)
    fixed, _ = r.per_example_bytes(1)
    assert f"its simulated peak is {fmt_bytes(r.peak_at(1))}" in message
    assert f"{fmt_bytes(fixed)} of it does not depend on the batch" in message
    assert "backprop_filter (tf.Conv2D) of conv" in message
    line = next(line for line in r.advice if line.startswith("largest batch within 5.0 GiB"))
    assert line.startswith("largest batch within 5.0 GiB: none, not even batch 1 fits")
    assert r.max_batch_size(8 << 30) > 0  # no warning where a batch fits


def test_bigconv3d_workspace_is_its_plan():
    """A BigDepthwiseConv3D layer's workspace is the plan its CPU kernels run (TF's
    Conv3D workspace is not modelled)."""
    model = keras.Sequential([keras.Input((16, 16, 16, 4)),
                              tfbigconv.keras.BigDepthwiseConv3D(9, padding="same", name="dw"),
                              keras.layers.GlobalAveragePooling3D()])
    report = tfbigconv.memory_report(model, 2, advice=False)
    row = [line for line in str(report).splitlines() if line.startswith("|   BigConv3D")]
    assert row, str(report)
    tf_ws, big_ws = [c.strip() for c in row[0].strip(" |").split("|")[-2:]]
    assert tf_ws == "0 B / 0 B" and big_ws != "0 B / 0 B", row[0]
    # the same plan explain shows for the forward pass
    fwd = tfbigconv.explain([2, 16, 16, 16, 4], [9, 9, 9, 1, 4], padding="SAME")
    chosen = [r for r in fwd.rows if r.chosen and r.pass_ == "forward"][0]
    from tfbigconv.text import fmt_bytes
    assert big_ws.startswith(fmt_bytes(chosen.workspace_bytes)), (big_ws, chosen)
