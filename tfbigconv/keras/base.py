"""The Big layers' logic, written once for both Keras flavours.

Keras 3 (`tfbigconv.keras.layers`) and Keras 2, i.e. tf_keras
(`tfbigconv.keras.keras2`), each define six thin classes: one of the `*Logic`
classes here plus that flavour's base layer (Conv2D, DepthwiseConv2D, ...), and a
`Flavour` with the few things that differ between the two. This module imports
neither Keras, so the Keras 2 classes do not need Keras 3 and vice versa.
"""
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


class Flavour:
    """What the layers need from one Keras flavour.

      check_backend: called by each layer's constructor; raises if the flavour
        cannot run TensorFlow ops.
      depthwise_kernel: the name of the depthwise layers' kernel attribute
        ("kernel" in Keras 3, "depthwise_kernel" in tf_keras).
      declares_jit: whether the flavour reads the layers' `supports_jit`
        (Keras 3 does; tf_keras has no such flag).
      package: the flavour's Python package ("keras" or "tf_keras").
    """

    def __init__(self, check_backend, depthwise_kernel, declares_jit, package):
        self.check_backend = check_backend
        self.depthwise_kernel = depthwise_kernel
        self.declares_jit = declares_jit
        self.package = package


# Each flavour's package -> (its name, the module of its Big layers), for the
# message when a layer of one flavour is called on the other's symbolic tensors.
_FLAVOUR_LAYERS = {"keras": ("Keras 3", "tfbigconv.keras.layers"),
                   "tf_keras": ("Keras 2 (tf_keras)", "tfbigconv.keras.keras2")}


class _BigConvMixin:
    """What every Big layer adds to its Keras base class; `_flavour` is set by the
    flavour's thin class."""

    _flavour = None

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
        # A Keras 3 layer in a tf_keras model (or the reverse) fails deep in Keras with
        # a message that does not say why; say which import gives the right layer.
        inputs = args[0] if args else kwargs.get("inputs")
        package = type(tf.nest.flatten(inputs)[0]).__module__.split(".")[0] if inputs is not None \
            else None
        if package in _FLAVOUR_LAYERS and package != self._flavour.package:
            ours, theirs = _FLAVOUR_LAYERS[self._flavour.package], _FLAVOUR_LAYERS[package]
            raise TypeError(
                f"{type(self).__name__} of {ours[1]} is a {ours[0]} layer, called on a "
                f"{theirs[0]} tensor; for {theirs[0]} models use "
                f"`from {theirs[1]} import {type(self).__name__}` (`tfbigconv.keras` gives "
                f"the layers of the Keras that `tf.keras` is)")
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

    Same arguments, defaults, weights and outputs as `keras.layers.Conv2D`
    (filters, kernel_size, strides, padding, data_format, dilation_rate, groups,
    activation, use_bias, the initializers, regularizers and constraints), plus:

      algorithm: "auto" (default) or another entry of `tfbigconv.ALGORITHMS`.
      workspace_limit: workspace budget in bytes for the FFT; 0 (default) means
        half of the free memory.

    Unlike Keras' TensorFlow backend, grouped convolution and "channels_first"
    run on CPU without XLA.
    """

    def __init__(self, filters, kernel_size, strides=(1, 1), padding="valid", data_format=None,
                 dilation_rate=(1, 1), groups=1, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, algorithm="auto",
                 workspace_limit=0, **kwargs):
        super().__init__(
            filters=filters, kernel_size=kernel_size, strides=strides, padding=padding,
            data_format=data_format, dilation_rate=dilation_rate, groups=groups,
            activation=activation, use_bias=use_bias, kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer, kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer, activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint, bias_constraint=bias_constraint, **kwargs)
        self._init_big(algorithm, workspace_limit)


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

    def __init__(self, kernel_size, strides=(1, 1), padding="valid", depth_multiplier=1,
                 data_format=None, dilation_rate=(1, 1), activation=None, use_bias=True,
                 depthwise_initializer="glorot_uniform", bias_initializer="zeros",
                 depthwise_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 depthwise_constraint=None, bias_constraint=None, algorithm="auto",
                 workspace_limit=0, **kwargs):
        super().__init__(
            kernel_size=kernel_size, strides=strides, padding=padding,
            depth_multiplier=depth_multiplier, data_format=data_format,
            dilation_rate=dilation_rate, activation=activation, use_bias=use_bias,
            depthwise_initializer=depthwise_initializer, bias_initializer=bias_initializer,
            depthwise_regularizer=depthwise_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer, depthwise_constraint=depthwise_constraint,
            bias_constraint=bias_constraint, **kwargs)
        self._init_big(algorithm, workspace_limit)


class BigConv1DLogic(_ConvLogic):
    """`keras.layers.Conv1D` computed by `tfbigconv.bigconv1d`.

    Same arguments, defaults, weights and outputs as `keras.layers.Conv1D`
    (filters, kernel_size, strides, padding "valid", "same" or "causal",
    data_format, dilation_rate, groups, activation, use_bias, the initializers,
    regularizers and constraints), plus `algorithm` and `workspace_limit` as in
    `BigConv2D`. Long kernels (a filter as long as the sequence, as in Hyena-style
    models) run as 1-D FFTs.
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", data_format=None,
                 dilation_rate=1, groups=1, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, algorithm="auto",
                 workspace_limit=0, **kwargs):
        super().__init__(
            filters=filters, kernel_size=kernel_size, strides=strides, padding=padding,
            data_format=data_format, dilation_rate=dilation_rate, groups=groups,
            activation=activation, use_bias=use_bias, kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer, kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer, activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint, bias_constraint=bias_constraint, **kwargs)
        self._init_big(algorithm, workspace_limit)


class BigDepthwiseConv1DLogic(_DepthwiseLogic):
    """`keras.layers.DepthwiseConv1D` computed by `tfbigconv.bigconv1d`.

    Same arguments, defaults, weights and outputs as
    `keras.layers.DepthwiseConv1D`, plus `algorithm` and `workspace_limit` as in
    `BigConv2D`, and one more padding: "causal" (as Conv1D's: output t sees inputs
    up to t), for long causal filters such as Hyena's. The kernel keeps Keras'
    shape [k, channels, depth_multiplier].
    """

    def __init__(self, kernel_size, strides=1, padding="valid", depth_multiplier=1,
                 data_format=None, dilation_rate=1, activation=None, use_bias=True,
                 depthwise_initializer="glorot_uniform", bias_initializer="zeros",
                 depthwise_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 depthwise_constraint=None, bias_constraint=None, algorithm="auto",
                 workspace_limit=0, **kwargs):
        causal = isinstance(padding, str) and padding.lower() == "causal"
        super().__init__(
            kernel_size=kernel_size, strides=strides, padding="valid" if causal else padding,
            depth_multiplier=depth_multiplier, data_format=data_format,
            dilation_rate=dilation_rate, activation=activation, use_bias=use_bias,
            depthwise_initializer=depthwise_initializer, bias_initializer=bias_initializer,
            depthwise_regularizer=depthwise_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer, depthwise_constraint=depthwise_constraint,
            bias_constraint=bias_constraint, **kwargs)
        if causal:  # both Kerases' output-shape rules read "causal" as "same"
            self.padding = "causal"
        self._init_big(algorithm, workspace_limit)


class BigConv3DLogic(_ConvLogic):
    """`keras.layers.Conv3D` computed by `tfbigconv.bigconv3d`.

    Same arguments, defaults, weights and outputs as `keras.layers.Conv3D`, plus
    `algorithm` and `workspace_limit` as in `BigConv2D`. Grouped convolution
    (`groups`), which TensorFlow's CPU Conv3D refuses, runs.
    """

    def __init__(self, filters, kernel_size, strides=(1, 1, 1), padding="valid",
                 data_format=None, dilation_rate=(1, 1, 1), groups=1, activation=None,
                 use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, algorithm="auto",
                 workspace_limit=0, **kwargs):
        super().__init__(
            filters=filters, kernel_size=kernel_size, strides=strides, padding=padding,
            data_format=data_format, dilation_rate=dilation_rate, groups=groups,
            activation=activation, use_bias=use_bias, kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer, kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer, activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint, bias_constraint=bias_constraint, **kwargs)
        self._init_big(algorithm, workspace_limit)


class BigDepthwiseConv3DLogic(_DepthwiseLogic):
    """Depthwise 3-D convolution, which Keras lacks, computed by `tfbigconv.bigconv3d`.

    `keras.layers.DepthwiseConv2D`'s arguments in 3-D: kernel_size (an int or 3
    ints), strides, padding ("valid" or "same"), depth_multiplier, data_format,
    dilation_rate, activation, use_bias, the depthwise initializer, regularizer and
    constraint, the bias's, plus `algorithm` and `workspace_limit` as in
    `BigConv2D`. Its kernel is [kd, kh, kw, channels, depth_multiplier], its
    output channel c * depth_multiplier + m, as DepthwiseConv2D's. Its base class
    is the flavour's rank-generic depthwise base, built with rank 3.
    """

    def __init__(self, kernel_size, strides=(1, 1, 1), padding="valid", depth_multiplier=1,
                 data_format=None, dilation_rate=(1, 1, 1), activation=None, use_bias=True,
                 depthwise_initializer="glorot_uniform", bias_initializer="zeros",
                 depthwise_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 depthwise_constraint=None, bias_constraint=None, algorithm="auto",
                 workspace_limit=0, **kwargs):
        super().__init__(
            rank=3, kernel_size=kernel_size, strides=strides, padding=padding,
            depth_multiplier=depth_multiplier, data_format=data_format,
            dilation_rate=dilation_rate, activation=activation, use_bias=use_bias,
            depthwise_initializer=depthwise_initializer, bias_initializer=bias_initializer,
            depthwise_regularizer=depthwise_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer, depthwise_constraint=depthwise_constraint,
            bias_constraint=bias_constraint, **kwargs)
        self._init_big(algorithm, workspace_limit)
