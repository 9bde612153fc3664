"""The memory report's rules: which tensors each op type's gradient keeps
(SAVED_FOR_BACKWARD), which buffer each op's output lives on (BufferRules,
read alike for a Keras trace and a graph), optimizer slots, and the
constants the report uses."""
import dataclasses
import types

import keras

# Op type -> {index of an input that gets a gradient: the op's tensors its
# gradient reads ("in<i>" for input i, "out<k>" for output k)}. Only data
# reads count: a gradient that reads a tensor's shape (tf.shape) does not keep
# its buffer. tests/memory/test_memory_report.py checks every entry against the
# gradient TensorFlow registers for the op type.
SAVED_FOR_BACKWARD = {
    # Convolutions: the input gradient needs the filter, the filter gradient the input.
    "Conv2D": {0: ("in1",), 1: ("in0",)},
    "DepthwiseConv2dNative": {0: ("in1",), 1: ("in0",)},
    "BigConv2D": {0: ("in1",), 1: ("in0",)},
    "Conv3D": {0: ("in1",), 1: ("in0",)},
    "BigConv3D": {0: ("in1",), 1: ("in0",)},
    "Conv2DBackpropInput": {1: ("in2",), 2: ("in1",)},  # Conv2DTranspose
    # Training mode (tf.nn.fused_batch_norm, tf.keras 2's BatchNormalization;
    # Keras 3's runs unfused ops, below): the gradient reads x, the scale and
    # the per-channel reserve spaces, not y. In inference mode it reads the
    # moving mean and variance instead of the reserve spaces: as small.
    "FusedBatchNormV3": {i: ("in0", "in1", "out3", "out4", "out5") for i in (0, 1, 2)},
    "MatMul": {0: ("in1",), 1: ("in0",)},
    "BatchMatMulV2": {0: ("in1",), 1: ("in0",)},
    # Elementwise arithmetic.
    "BiasAdd": {0: (), 1: ()},
    "AddV2": {0: (), 1: ()},
    "Sub": {0: (), 1: ()},
    "AddN": {},  # every input: nothing (filled in below)
    "Neg": {0: ()},
    "Mul": {0: ("in1",), 1: ("in0",)},
    "RealDiv": {0: ("in1",), 1: ("in0", "in1")},
    "Maximum": {0: ("in0", "in1"), 1: ("in0", "in1")},
    "Minimum": {0: ("in0", "in1"), 1: ("in0", "in1")},
    "SquaredDifference": {0: ("in0", "in1"), 1: ("in0", "in1")},
    "Square": {0: ("in0",)},
    "Sqrt": {0: ("out0",)},
    "Rsqrt": {0: ("out0",)},
    "Exp": {0: ("out0",)},
    "Log": {0: ("in0",)},
    "Abs": {0: ("in0",)},
    "Erf": {0: ("in0",)},
    "Erfc": {0: ("in0",)},
    # Activations.
    "Relu": {0: ("out0",)},
    "Relu6": {0: ("out0",)},
    "Elu": {0: ("out0",)},
    "Selu": {0: ("out0",)},
    "LeakyRelu": {0: ("in0",)},
    "Softplus": {0: ("in0",)},
    "Sigmoid": {0: ("out0",)},
    "Tanh": {0: ("out0",)},
    "Softmax": {0: ("out0",)},
    "LogSoftmax": {0: ("out0",)},
    # tf.where(cond, x, y) (Dropout's): both gradients select with the bool condition.
    "SelectV2": {1: ("in0",), 2: ("in0",)},
    # Pooling, resizing, reductions.
    "MaxPool": {0: ("in0", "out0")},
    "AvgPool": {0: ()},
    "Mean": {0: ()},
    "Sum": {0: ()},
    "ResizeNearestNeighbor": {0: ()},
    "ResizeBilinear": {0: ("in0",)},
    # Data movement: gradients are slices, pads, sums or reshapes of the incoming one.
    "ConcatV2": {},  # every value input: nothing (filled in below)
    "Pack": {},
    "Split": {1: ()},  # input 0 is the axis
    "SplitV": {0: ()},
    "ReverseV2": {0: ()},
    "Tile": {0: ()},
    "Pad": {0: ()},
    "PadV2": {0: ()},
    "MirrorPad": {0: ()},
    "Slice": {0: ()},
    "StridedSlice": {0: ()},
    "Transpose": {0: ()},
    "Cast": {0: ()},
    "Identity": {0: ()},
    "Reshape": {0: ()},
    "Squeeze": {0: ()},
    "ExpandDims": {0: ()},
    "DepthToSpace": {0: ()},
    "SpaceToDepth": {0: ()},
    # tf.signal's real FFTs: each gradient is the other transform of the
    # incoming gradient, scaled (fft_ops.py); the forward tensors' shapes only.
    "RFFT": {0: ()},
    "IRFFT": {0: ()},
    # IdentityN's gradient is the incoming one (TF's _IdentityNGrad): a
    # tf.custom_gradient's forward (IdentityN of its outputs and inputs) keeps
    # what its ops' own rules keep (a routed Conv2D: its input and filter).
    "IdentityN": {},
}
VARIADIC_NOTHING = ("AddN", "ConcatV2", "Pack", "IdentityN")  # any input index: nothing kept

# Op type -> (tensor, bytes per element, what): a transient buffer that TF's
# own CPU gradient kernel (oneDNN off, or not rewritten) allocates while it
# runs, per element of that tensor of the forward op. MaxPoolGrad
# (maxpooling_op.cc) fills an int64 argmax of the output's shape
# (TF_CPP_VMODULE=log_memory=2: 1.0 MiB DT_INT64 for an 8x32x32x16 output);
# oneDNN's MaxPool keeps its own workspace instead (workspaces.py).
GRADIENT_TEMPORARIES = {
    "MaxPool": ("out0", 8, "MaxPoolGrad's argmax (int64)"),
    # RFFT's gradient (fft_ops.py _rfft_grad_helper) adds to the IRFFT of the
    # incoming gradient the terms Hermitian symmetry dropped: a complex64
    # tensor of the input's shape, then its real part. Measured (RSS, oneDNN
    # off): the gradient of a 1x256x8192 RFFT peaked at 32 MiB, its 8 MiB
    # output and 24 MiB more. TF's CPU FFT kernels themselves (DUCC) allocate
    # nothing beyond their outputs.
    "RFFT": ("in0", 12, "RFFT's gradient: the Hermitian terms (complex64) and their real part"),
}

# Gradient op type -> (the forward op type it differentiates, the input that
# is the forward op's output): where a graph holds its gradients as ops, a
# GRADIENT_TEMPORARIES rule of the forward op applies to its gradient op.
GRADIENT_OPS = {
    "MaxPoolGrad": ("MaxPool", 1),
}

# Op type -> the inputs whose buffer its CPU kernel takes over for its output
# (OpKernelContext::forward_input_or_allocate_output: TF's element-wise,
# activation, BiasAdd and AddN kernels) where the input has the output's dtype
# and size and nothing else holds it (its buffer's reference count is one: no
# reader left after this op, not a variable, a constant or a fetched tensor).
# None: any input. TF's allocator log (TF_CPP_VMODULE=log_memory=2) of a
# tf.function CNN step, oneDNN on: ReluGrad wrote into MaxPoolGrad's output,
# Adam's Sub, Mul and AddV2 into their inputs, with no allocation of their own.
_UNARY = ("Neg", "Square", "Sqrt", "Rsqrt", "Exp", "Log", "Log1p", "Expm1", "Abs", "Sign",
          "Reciprocal", "Floor", "Ceil", "Round", "Erf", "Erfc", "Sigmoid", "Tanh",
          "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus", "Softsign", "BiasAdd")
_BINARY = ("AddV2", "Add", "Sub", "Mul", "MulNoNan", "RealDiv", "Div", "DivNoNan", "Maximum",
           "Minimum", "SquaredDifference", "Pow", "ReluGrad", "Relu6Grad", "EluGrad",
           "SeluGrad", "LeakyReluGrad", "SoftplusGrad", "SigmoidGrad", "TanhGrad", "SqrtGrad",
           "RsqrtGrad")
FORWARDS_INPUT = {**dict.fromkeys(_UNARY, (0,)), **dict.fromkeys(_BINARY, (0, 1)), "AddN": None}

# Ops whose output shares its input's buffer (TensorFlow forwards it).
ALIASES = ("Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
            "PreventGradient")
# Ops without a gradient, and ops that only read shapes.
NO_GRADIENT = ("Shape", "ShapeN", "Size", "Rank", "StopGradient", "PreventGradient",
                "ArgMax", "ArgMin", "ZerosLike", "OnesLike", "Fill", "RandomUniform",
                "RandomStandardNormal", "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                "BroadcastGradientArgs", "AssignVariableOp", "AssignAddVariableOp",
                "AssignSubVariableOp", "NoOp", "Const", "Placeholder", "VarHandleOp")
# The optimizer's update as a Keras trace synthesizes it (trace.py): one op that
# reads every weight's gradient and holds a few temporaries of one weight's
# size while it runs (simulate.update_temporaries).
OPTIMIZER_UPDATE = "ApplyGradients"
# max_batch_size keeps this fraction of the simulated peak in reserve: the
# simulation has been 17% under measured peaks on the CPU (a ResNet-style
# model at batch 15; benchmarks/RESULTS.md).
SAFETY_MARGIN = 0.2
# TensorFlow's default cap on a cuDNN workspace (TF_CUDNN_WORKSPACE_LIMIT_IN_MB).
CUDNN_WORKSPACE_LIMIT = 4 << 30
# Optimizer class -> slot variables per trainable weight (Keras 3).
OPTIMIZER_SLOTS = {"SGD": 0, "Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "Lamb": 2,
                   "Adadelta": 2, "Ftrl": 2, "Adagrad": 1, "RMSprop": 1, "Lion": 1,
                   "Adafactor": 2}


@dataclasses.dataclass(frozen=True)
class BufferRules:
    """Which buffer each op's output lives on, and what its gradient keeps:
    the tables above, read one way for a Keras model's trace and for a graph.

    aliases: ops whose output views their input's buffer (TensorFlow forwards
      it); forwards_input: {op type: the inputs whose buffer its kernel may
      write its output into (None: any)}; saved_for_backward: {op type:
      {input index with a gradient: the tensors that gradient reads}};
      variadic_nothing: op types whose every input's gradient keeps nothing."""
    aliases: tuple = ALIASES
    forwards_input: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: types.MappingProxyType(FORWARDS_INPUT))
    saved_for_backward: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: types.MappingProxyType(SAVED_FOR_BACKWARD))
    variadic_nothing: tuple = VARIADIC_NOTHING

    def viewed_input(self, op_type, index, n_inputs, is_ref=False):
        """The input whose buffer output `index` of an op views, or None (a
        buffer of its own): a ref output (Assign, ApplyAdam: the variable's),
        an alias's, tf.custom_gradient's IdentityN (output i is input i)."""
        if not n_inputs:
            return None
        if is_ref or op_type in self.aliases:
            return 0
        if op_type == "IdentityN" and index < n_inputs:
            return index
        return None

    def forwardable(self, op_type, n_inputs):
        """Indices of the inputs an op's kernel may write its output into."""
        indices = self.forwards_input.get(op_type, ())
        return range(n_inputs) if indices is None else [i for i in indices if i < n_inputs]

    def saved(self, op_type, grad_index):
        """The refs ("in<i>", "out<k>") the gradient of input grad_index of
        an op reads, or None where no rule is known."""
        rule = self.saved_for_backward.get(op_type)
        if rule is None:
            return None
        return rule.get(grad_index, () if op_type in self.variadic_nothing else None) or ()

    def passes_gradient_through(self, op_type, index, input_dims, output_dims):
        """Whether the gradient of input `index` is the incoming gradient
        itself (TensorFlow returns it unchanged, no new buffer): aliases,
        BiasAdd's value, and AddV2/Sub/AddN operands of the output's shape;
        IdentityN's input i takes output i's gradient (gradient_output)."""
        if op_type in self.aliases or op_type == "IdentityN":
            return True
        if op_type == "BiasAdd":
            return index == 0
        if op_type in ("AddV2", "AddN") or (op_type == "Sub" and index == 0):
            return input_dims == output_dims
        return False


    @staticmethod
    def gradient_output(op_type, index):
        """The output whose gradient input `index` takes where it passes
        through: IdentityN's output i for input i, else output 0."""
        return index if op_type == "IdentityN" else 0


BUFFER_RULES = BufferRules()


def optimizer_slots(optimizer):
    """Slot variables per trainable weight that `optimizer` (a Keras optimizer,
    its name, or None for plain SGD) keeps; (count, note)."""
    if optimizer is None:
        return 0, "none (plain SGD assumed)"
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    name = type(optimizer).__name__
    if name not in OPTIMIZER_SLOTS:
        return 2, f"{name}: slots unknown, 2 per weight assumed"
    slots = OPTIMIZER_SLOTS[name]
    if name == "SGD" and getattr(optimizer, "momentum", 0):
        slots = 1
    if name == "RMSprop":
        slots += bool(getattr(optimizer, "momentum", 0)) + bool(getattr(optimizer, "centered", False))
    if getattr(optimizer, "amsgrad", False):
        slots += 1
    if getattr(optimizer, "use_ema", False):
        slots += 1
    return slots, name
