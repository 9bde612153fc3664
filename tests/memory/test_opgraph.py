"""tfbigconv/memory/opgraph.py and the BufferRules it builds with: one builder
for a graph's ops and a Keras trace's; the gradient and update ops a trace
synthesizes (trace.Trace.step)."""
import keras
import tensorflow as tf

from tfbigconv.memory.opgraph import Kind, OpGraph, Phase
from tfbigconv.memory.rules import BUFFER_RULES, OPTIMIZER_UPDATE
from tfbigconv.memory.trace import Trace

v1 = tf.compat.v1


def _built(graph):
    g = OpGraph()
    g.add_tf_ops(graph.get_operations(), lambda op: None, lambda op: Phase.FORWARD)
    return g


def test_buffers_views_and_kinds():
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        w = v1.Variable(tf.ones([4]), name="w", use_resource=False)
        r = tf.reshape(x * tf.constant(2.0, name="two"), [-1, 2, 2], name="r")
        a, b = tf.identity_n([r, x], name="pair")
        assign = v1.assign(w, tf.zeros([4]), name="assign")
    g = _built(graph)
    t = g.tensors
    assert t["x:0"].kind == Kind.INPUT and t["w:0"].kind == Kind.PARAMETER
    assert t["two:0"].kind == Kind.CONSTANT
    assert t["r:0"].base == "mul:0" and t["mul:0"].base == "mul:0"  # Reshape views
    assert (t[a.name].base, t[b.name].base) == ("mul:0", "x:0")  # IdentityN: output i is input i
    assert t[assign.name].base == "w:0"  # a ref output is the variable's buffer
    assert t["w:0"].itemsize == 4  # of the base dtype, not the ref
    assert g.producers["r"] == {"mul", "r/shape"} and "r" in g.consumers["mul"]
    assert t["r:0"].shape(3) == [3, 2, 2] and t["mul:0"].batched


def test_conv_ops_carry_their_passes_and_a_gradient_its_forward_op():
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8, 8, 3])
        w = tf.ones([3, 3, 3, 4])
        y = tf.nn.max_pool2d(tf.nn.conv2d(x, w, 1, "SAME"), 2, 2, "VALID")
        tf.gradients(tf.reduce_sum(y), [x, w])
    g = _built(graph)
    by_type = {op.type: op for op in g.ops}
    assert by_type["Conv2D"].passes == ("forward",) and by_type["Conv2D"].conv is by_type["Conv2D"]
    assert by_type["Conv2DBackpropFilter"].passes == ("backprop_filter",)
    assert by_type["MaxPoolGrad"].forward is by_type["MaxPool"]
    assert by_type["MaxPool"].passes == () and by_type["MaxPool"].forward is None


def test_buffer_rules():
    assert BUFFER_RULES.viewed_input("Reshape", 0, 2) == 0
    assert BUFFER_RULES.viewed_input("IdentityN", 1, 2) == 1
    assert BUFFER_RULES.viewed_input("Relu", 0, 1) is None
    assert BUFFER_RULES.viewed_input("Relu", 0, 1, is_ref=True) == 0
    assert list(BUFFER_RULES.forwardable("AddN", 3)) == [0, 1, 2]
    assert list(BUFFER_RULES.forwardable("ReluGrad", 2)) == [0, 1]
    assert list(BUFFER_RULES.forwardable("MatMul", 2)) == []
    assert BUFFER_RULES.saved("Relu", 0) == ("out0",) and BUFFER_RULES.saved("ConcatV2", 5) == ()
    assert BUFFER_RULES.saved("NoSuchOp", 0) is None
    assert BUFFER_RULES.passes_gradient_through("AddV2", 1, [None, 4], [None, 4])
    assert not BUFFER_RULES.passes_gradient_through("AddV2", 1, [4], [None, 4])
    assert BUFFER_RULES.passes_gradient_through("BiasAdd", 0, [None, 4], [None, 4])
    assert not BUFFER_RULES.passes_gradient_through("BiasAdd", 1, [4], [None, 4])


def test_a_keras_step_synthesizes_its_gradient_and_update_ops():
    """x -> Conv2D -> ReLU, whose output both a second Conv2D and the Add
    after it read: one gradient op per pass of each convolution (the first's
    input gradient is not needed: x is the batch), an AddN of the ReLU
    output's two gradient parts, and one update op reading every weight's
    gradient."""
    x = keras.Input((8, 8, 3))
    h = keras.layers.ReLU()(keras.layers.Conv2D(4, 3, padding="same", name="c1")(x))
    y = keras.layers.Add()([h, keras.layers.Conv2D(4, 3, padding="same", name="c2")(h)])
    trace = Trace(keras.Model(x, y))
    step = trace.step()
    grads = [op for op in step.ops if op.phase == Phase.BACKWARD]
    passes = sorted((op.conv.layer.label, op.passes) for op in grads if op.passes)
    assert passes == [("c1", ("backprop_filter",)), ("c2", ("backprop_filter",)),
                      ("c2", ("backprop_input",))]
    (total,) = [op for op in grads if op.type == "AddN"]
    assert len(total.inputs) == 2
    relu_grad = next(op for op in grads if op.type == "ReluGrad")
    assert relu_grad.inputs[0] == total.outputs[0]  # the sum, then the kept output
    (update,) = [op for op in step.ops if op.phase == Phase.UPDATE]
    assert update.type == OPTIMIZER_UPDATE and len(update.inputs) == 4  # 2 kernels, 2 biases
    assert trace.step() is step and trace.step(recompute=[trace.calls[1]]) is not step
    assert trace.forward.ops == trace.ops and len(trace.forward.ops) < len(step.ops)
