"""The Big layers' logic, written once for both Keras flavours.

Each flavour's thin classes (`tfbigconv.keras.flavours.LAYER_CLASSES`: one of the
`*Logic` classes here on that flavour's Keras layer, Conv2D, DepthwiseConv2D, ...)
are made by its `Flavour`, which the classes hold as `_flavour`. The logic adds
`algorithm` and `workspace_limit` to the Keras constructor and passes everything
else through, so each flavour's own signature and defaults hold; each class's
`__signature__` (what help() and inspect show) is that signature plus the two.
This module imports neither Keras, so the Keras 2 classes do not need Keras 3 and
vice versa.
"""
import inspect
import numbers

import tensorflow as tf

from tfbigconv.arguments import ALGORITHMS
from tfbigconv.ops.conv1d import bigconv1d
from tfbigconv.ops.conv2d import bigconv2d
from tfbigconv.ops.conv3d import bigconv3d

# Keras' rank -> our op and its data formats.
_OPS = {1: (bigconv1d, {"channels_last": "NWC", "channels_first": "NCW"}),
        2: (bigconv2d, {"channels_last": "NHWC", "channels_first": "NCHW"}),
        3: (bigconv3d, {"channels_last": "NDHWC", "channels_first": "NCDHW"})}


def declares_jit():
    """The layers' `supports_jit`: True where no GPU is visible, else False.

    Keras compiles a model with XLA under `jit_compile=True` only when every
    layer declares support, and under the default `jit_compile="auto"` only on
    machines with a GPU (Keras 3 turns XLA off on CPU-only machines). Under XLA
    our layers run bigconv2d's pure-TensorFlow path, slower than our kernels
    (benchmarks/RESULTS.md, "XLA"). So: on a CPU-only machine they declare it,
    which lets `jit_compile=True` compile the model and changes nothing by
    default; where a GPU is visible they do not, so that "auto" keeps our CUDA
    kernels (the pure-TF path on the GPU has not been measured against them)."""
    return not tf.config.list_physical_devices("GPU")


def check_options(algorithm, workspace_limit):
    """The two arguments the Big layers add, checked as Keras checks its own."""
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"Invalid value for argument `algorithm`: expected one of "
                         f"{ALGORITHMS}. Received algorithm={algorithm!r}")
    if (isinstance(workspace_limit, bool) or not isinstance(workspace_limit, numbers.Integral)
            or workspace_limit < 0):
        raise ValueError("Invalid value for argument `workspace_limit`: expected a non-negative "
                         f"int (bytes; 0 = from free memory). Received "
                         f"workspace_limit={workspace_limit!r}")
    return algorithm, int(workspace_limit)


def _arguments_of(init):
    """The signature of constructor `init` without its self."""
    signature = inspect.signature(init)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _by_name(bound):
    """The arguments of `bound` as {name: value}, its **kwargs merged in."""
    given = dict(bound.arguments)
    for name, p in bound.signature.parameters.items():
        if p.kind is p.VAR_KEYWORD:
            given.update(given.pop(name, {}))
    return given


class _BigConvMixin:
    """What every Big layer adds to its Keras base class; `_flavour` (a
    `tfbigconv.keras.flavours.Flavour`) is set by the flavour's thin class."""

    _flavour = None
    _keras_signature = None  # _keras_arguments(), set on a flavour's class

    def __init__(self, *args, algorithm="auto", workspace_limit=0, **kwargs):
        # The rest is the Keras class's own: its positions, names and defaults.
        super().__init__(*args, **kwargs)
        self._init_big(algorithm, workspace_limit)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._flavour is not None:  # a flavour's class: its signature, for help() and inspect
            # Read once, from the classes as they are now (a test harness may patch
            # keras.layers later).
            cls._keras_signature = cls._keras_arguments()
            theirs = list(cls._keras_signature.parameters.values())
            ours = [p for p in _arguments_of(_BigConvMixin.__init__).parameters.values()
                    if p.kind is p.KEYWORD_ONLY]
            cls.__signature__ = inspect.Signature(
                [p for p in theirs if p.kind is not p.VAR_KEYWORD] + ours
                + [p for p in theirs if p.kind is p.VAR_KEYWORD])

    @classmethod
    def _keras_arguments(cls):
        """The Keras arguments the constructor takes: its Keras base class's."""
        keras_base = next(c for c in cls.__mro__[1:] if not issubclass(c, _BigConvMixin))
        return _arguments_of(keras_base.__init__)

    def _init_big(self, algorithm, workspace_limit):
        self._flavour.check_backend()
        self.algorithm, self.workspace_limit = check_options(algorithm, workspace_limit)
        if self._flavour.declares_jit:
            self.supports_jit = declares_jit()

    @classmethod
    def convert_in_place(cls, layer, algorithm="auto", workspace_limit=0):
        """Makes `layer`, an instance of exactly this class's Keras base class (Conv2D
        for BigConv2D, ...), an instance of this class: the same object, variables and
        Keras config, plus `algorithm` and `workspace_limit`. Built or not: the build is
        Keras'. All that __init__ adds to Keras' is `_init_big`'s."""
        layer.__class__ = cls
        layer._init_big(algorithm, workspace_limit)
        return layer

    def __call__(self, *args, **kwargs):
        inputs = args[0] if args else kwargs.get("inputs")
        if inputs is not None:
            self._flavour.check_tensor(type(self).__name__, tf.nest.flatten(inputs)[0])
        return super().__call__(*args, **kwargs)

    def _bigconv(self, inputs, kernel):
        # The kernel variable may be float32 under a mixed policy while the
        # inputs come in the compute dtype; our ops want equal dtypes.
        kernel = tf.cast(kernel, inputs.dtype)
        conv, formats = _OPS[self.rank]
        return conv(
            inputs, kernel, list(self.strides), self.padding.upper(),
            data_format=formats[self.data_format], dilations=list(self.dilation_rate),
            algorithm=self.algorithm, workspace_limit=self.workspace_limit)

    def _bias_and_activation(self, outputs):
        """What Keras' call adds after the convolution."""
        if self.use_bias:
            bias = tf.cast(self.bias, outputs.dtype)
            if self.data_format == "channels_first":
                bias = tf.reshape(bias, (1, -1) + (1,) * self.rank)
            outputs = outputs + bias
        if self.activation is not None:
            return self.activation(outputs)
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update({"algorithm": self.algorithm, "workspace_limit": self.workspace_limit})
        return config


class _ConvLogic(_BigConvMixin):
    """Conv1D/2D/3D: the whole call is ours (one path for both flavours: tf_keras'
    Conv.call would pad "causal" itself and send groups > 1 through XLA)."""

    def convolution_op(self, inputs, kernel):
        return self._bigconv(inputs, kernel)

    def call(self, inputs):
        return self._bias_and_activation(self._bigconv(inputs, self.kernel))


class _DepthwiseLogic(_BigConvMixin):
    """Keras' depthwise kernel [*kernel_size, channels, multiplier] run as a grouped
    convolution, one group per channel: filter [*kernel_size, 1, channels * multiplier],
    whose output channel c * multiplier + m is Keras' (and TensorFlow's) order."""

    def call(self, inputs):
        kernel = getattr(self, self._flavour.depthwise_kernel)
        *size, channels, multiplier = kernel.shape
        kernel = tf.reshape(kernel, (*size, 1, channels * multiplier))
        return self._bias_and_activation(self._bigconv(inputs, kernel))


class BigConv2DLogic(_ConvLogic):
    """`keras.layers.Conv2D` computed by `tfbigconv.bigconv2d`.

    Same arguments (positional and keyword), defaults, weights and outputs as
    the flavour's `Conv2D` (Keras 3's `keras.layers.Conv2D` or tf_keras'), which
    the constructor passes them to, plus two keyword-only arguments:

      algorithm: "auto" (default) or another entry of `tfbigconv.ALGORITHMS`.
      workspace_limit: workspace budget in bytes for the FFT; 0 (default) means
        half of the free memory.

    Unlike Keras' TensorFlow backend, grouped convolution and "channels_first"
    run on CPU without XLA.
    """


class BigDepthwiseConv2DLogic(_DepthwiseLogic):
    """`keras.layers.DepthwiseConv2D` computed by `tfbigconv.bigconv2d`.

    Same arguments, defaults, weights and outputs as
    `keras.layers.DepthwiseConv2D` (kernel_size, strides, padding,
    depth_multiplier, data_format, dilation_rate, activation, use_bias, the
    initializers, regularizers and constraints), plus `algorithm` and
    `workspace_limit` as in `BigConv2D`.

    The kernel keeps Keras' shape [kh, kw, channels, depth_multiplier]; the
    call runs it as a grouped convolution with one group per input channel and
    filter [kh, kw, 1, channels * depth_multiplier], whose output channel
    c * depth_multiplier + m is Keras' (and tf.nn.depthwise_conv2d's) channel
    order.
    """


class BigConv1DLogic(_ConvLogic):
    """`keras.layers.Conv1D` computed by `tfbigconv.bigconv1d`.

    Same arguments, defaults, weights and outputs as `keras.layers.Conv1D`
    (filters, kernel_size, strides, padding "valid", "same" or "causal",
    data_format, dilation_rate, groups, activation, use_bias, the initializers,
    regularizers and constraints), plus `algorithm` and `workspace_limit` as in
    `BigConv2D`. Long kernels (a filter as long as the sequence, as in Hyena-style
    models) run as 1-D FFTs.
    """


class BigDepthwiseConv1DLogic(_DepthwiseLogic):
    """`keras.layers.DepthwiseConv1D` computed by `tfbigconv.bigconv1d`.

    Same arguments, defaults, weights and outputs as
    `keras.layers.DepthwiseConv1D`, plus `algorithm` and `workspace_limit` as in
    `BigConv2D`, and one more padding: "causal" (as Conv1D's: output t sees inputs
    up to t), for long causal filters such as Hyena's. The kernel keeps Keras'
    shape [k, channels, depth_multiplier].
    """

    def __init__(self, *args, **kwargs):
        # Keras refuses "causal" here; both Kerases' output-shape rules read it as "same".
        bound = self._keras_signature.bind(*args, **kwargs)
        padding = bound.arguments.get("padding")
        causal = isinstance(padding, str) and padding.lower() == "causal"
        if causal:
            bound.arguments["padding"] = "valid"
        super().__init__(*bound.args, **bound.kwargs)
        if causal:
            self.padding = "causal"


class BigConv3DLogic(_ConvLogic):
    """`keras.layers.Conv3D` computed by `tfbigconv.bigconv3d`.

    Same arguments, defaults, weights and outputs as `keras.layers.Conv3D`, plus
    `algorithm` and `workspace_limit` as in `BigConv2D`. Grouped convolution
    (`groups`), which TensorFlow's CPU Conv3D refuses, runs.
    """


class BigDepthwiseConv3DLogic(_DepthwiseLogic):
    """Depthwise 3-D convolution, which Keras lacks, computed by `tfbigconv.bigconv3d`.

    `keras.layers.DepthwiseConv2D`'s arguments in 3-D: kernel_size (an int or 3
    ints), strides, padding ("valid" or "same"), depth_multiplier, data_format,
    dilation_rate, activation, use_bias, the depthwise initializer, regularizer and
    constraint, the bias's, plus `algorithm` and `workspace_limit` as in
    `BigConv2D`. Its kernel is [kd, kh, kw, channels, depth_multiplier], its
    output channel c * depth_multiplier + m, as DepthwiseConv2D's. Positional
    arguments mean what they mean in the flavour's DepthwiseConv2D. Its base
    class is the flavour's rank-generic depthwise base, built with rank 3.
    """

    @classmethod
    def _keras_arguments(cls):
        """DepthwiseConv2D's, in its order, with the rank-generic base's defaults where
        it has them (strides=1: (1, 1, 1))."""
        like = _arguments_of(cls._flavour.keras.layers.DepthwiseConv2D.__init__)
        base = _arguments_of(cls._flavour.depthwise_base.__init__).parameters
        return like.replace(parameters=[
            p.replace(default=base[name].default)
            if name in base and base[name].default is not p.empty else p
            for name, p in like.parameters.items()])

    def __init__(self, *args, **kwargs):
        bound = self._keras_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        super().__init__(rank=3, **_by_name(bound))
