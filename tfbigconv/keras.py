"""Keras 3 layers on tfbigconv's kernels: drop-in for Conv2D and DepthwiseConv2D.

`BigConv2D` and `BigDepthwiseConv2D` subclass `keras.layers.Conv2D` and
`keras.layers.DepthwiseConv2D`, so they take the same constructor arguments with
the same defaults, create the same weights (same names, shapes and order), and
serialize the same way; only the convolution itself runs through
`tfbigconv.bigconv2d`. Two extra arguments are passed through to it:

  algorithm: one of `tfbigconv.ALGORITHMS` ("auto" by default).
  workspace_limit: workspace budget in bytes; 0 (default) means decided from
    free memory.

Both layers are registered as Keras serializable objects (package "tfbigconv"),
so `.keras` files load with `keras.models.load_model` once `tfbigconv` has been
imported. They set `supports_jit = False`: the custom ops cannot be compiled by
XLA, and Keras would otherwise turn XLA on by default on GPU machines.

Mixed precision: under a "mixed_float16" or "mixed_bfloat16" policy the kernel
stays float32 and the convolution runs in the compute dtype (the kernels
accumulate half types in float32), like the Keras layers.

Requires Keras 3 with the TensorFlow backend.
"""
import numbers

import keras
import tensorflow as tf

from tfbigconv import fuse, fuse_train
from tfbigconv.conv import ALGORITHMS, bigconv2d

if int(keras.__version__.split(".")[0]) < 3:  # pragma: no cover - depends on the install
    raise ImportError(
        f"tfbigconv.keras needs Keras 3 (found keras {keras.__version__}); "
        "for tf.keras 2 (tf_keras) call tfbigconv.bigconv2d from your own layer")

__all__ = ["BigConv2D", "BigDepthwiseConv2D", "FusedLinearConv", "FusedBiasMap"]

_DATA_FORMATS = {"channels_last": "NHWC", "channels_first": "NCHW"}


def _check_backend():
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "tfbigconv's Keras layers run TensorFlow ops and need the TensorFlow backend; "
            f"the Keras backend is {keras.backend.backend()!r} (set KERAS_BACKEND=tensorflow)")


def _check_options(algorithm, workspace_limit):
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"Invalid value for argument `algorithm`: expected one of "
                         f"{ALGORITHMS}. Received algorithm={algorithm!r}")
    if (isinstance(workspace_limit, bool) or not isinstance(workspace_limit, numbers.Integral)
            or workspace_limit < 0):
        raise ValueError("Invalid value for argument `workspace_limit`: expected a non-negative "
                         f"int (bytes; 0 = from free memory). Received "
                         f"workspace_limit={workspace_limit!r}")
    return algorithm, int(workspace_limit)


class _BigConvMixin:
    """What both layers add to their Keras base class."""

    def _init_big(self, algorithm, workspace_limit):
        _check_backend()
        self.algorithm, self.workspace_limit = _check_options(algorithm, workspace_limit)
        self.supports_jit = False

    def _bigconv(self, inputs, kernel):
        # The kernel variable may be float32 under a mixed policy while the
        # inputs come in the compute dtype; bigconv2d wants equal dtypes.
        kernel = tf.cast(kernel, inputs.dtype)
        return bigconv2d(
            inputs, kernel, strides=list(self.strides), padding=self.padding.upper(),
            data_format=_DATA_FORMATS[self.data_format], dilations=list(self.dilation_rate),
            algorithm=self.algorithm, workspace_limit=self.workspace_limit)

    def _big_config(self, config):
        config.update({"algorithm": self.algorithm, "workspace_limit": self.workspace_limit})
        return config


@keras.saving.register_keras_serializable(package="tfbigconv")
class BigConv2D(_BigConvMixin, keras.layers.Conv2D):
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

    def convolution_op(self, inputs, kernel):
        return self._bigconv(inputs, kernel)

    def get_config(self):
        return self._big_config(super().get_config())


@keras.saving.register_keras_serializable(package="tfbigconv")
class BigDepthwiseConv2D(_BigConvMixin, keras.layers.DepthwiseConv2D):
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

    def call(self, inputs):
        kh, kw, channels, multiplier = self.kernel.shape
        kernel = tf.reshape(self.kernel, (kh, kw, 1, channels * multiplier))
        outputs = self._bigconv(inputs, kernel)
        if self.use_bias:
            bias = tf.cast(self.bias, outputs.dtype)
            if self.data_format == "channels_first":
                bias = tf.reshape(bias, (1, -1, 1, 1))
            outputs = outputs + bias
        if self.activation is not None:
            return self.activation(outputs)
        return outputs

    def get_config(self):
        return self._big_config(super().get_config())


@keras.saving.register_keras_serializable(package="tfbigconv")
class FusedLinearConv(keras.layers.Layer):
    """A linear subgraph of convolutions that keeps only its input for backprop, trainable.

    Made by `tfbigconv.fuse_linear(model, trainable=True)`. It keeps the
    original layers' weights as its own variables (named layer_attribute,
    e.g. "conv1_kernel") and runs in one of two modes
    (`tfbigconv.fuse_train`):

      "fused": on every call it composes the fused kernel and bias from the
        weights (`tfbigconv.fuse.compose_program`: weight-sized work) and runs
        one `bigconv2d` on the input. Where the kernel cannot reproduce an
        intermediate zero padding (a chain of SAME convs, stride 1), the
        outputs near the borders come from the unfused layers run on strips of
        the input (`tfbigconv.fuse.border_strips`).
      "recompute": it runs the original convolutions, and its gradient keeps
        only the input and the weights; backprop recomputes the intermediate
        tensors that convolutions inside the subgraph read (for the seed block
        p = 1x1 conv(x)), never the subgraph's output.
      "auto" (default): the one with the smaller estimated step time
        (forward pass only when the layer is not trainable), decided when the
        call is traced, for its batch size (unknown: 32 images);
        `choose_mode(batch)` says which and why.

    Either way gradients reach the original weights, so training matches the
    unfused subgraph.

    Args:
      program: the subgraph as a list of steps (see tfbigconv.fuse).
      weight_shapes: [[name, shape], ...], the variables in order.
      input_size: (height, width) of the input; the fusion's border checks
        and bias map are for this size.
      channels: input channels.
      algorithm, workspace_limit: as in `BigConv2D`, for every convolution
        the layer runs.
      mode: "auto", "fused" or "recompute".
    Input and output are channels_last.
    """

    def __init__(self, program, weight_shapes, input_size, channels, algorithm="auto",
                 workspace_limit=0, mode="auto", **kwargs):
        super().__init__(**kwargs)
        _check_backend()
        self.algorithm, self.workspace_limit = _check_options(algorithm, workspace_limit)
        self.mode = _check_mode(mode)
        self.program = [dict(step) for step in program]
        self.weight_shapes = [[name, [int(d) for d in shape]] for name, shape in weight_shapes]
        self.input_size = tuple(int(v) for v in input_size)
        self.channels = int(channels)
        self.supports_jit = False
        self.branch_weights = {}
        self._choices = {}  # (batch, trainable) -> ModeChoice

    def build(self, input_shape):
        for name, shape in self.weight_shapes:
            self.branch_weights[name] = self.add_weight(name=name, shape=tuple(shape),
                                                        initializer="zeros")
        self.built = True

    def fused(self):
        """The composed (LinearMap, bias) from the current weights; bias is a vector,
        a bias map [out_h, out_w, channels], or None."""
        weights = dict(self.branch_weights)
        m = fuse.compose_program(self.program, weights, self.input_size, self.channels,
                                 self.variable_dtype, patch_borders=True)
        if m.bias_padded and not m.patched:
            return m, fuse.bias_map(self.program, weights, self.input_size, self.channels,
                                    self.variable_dtype)
        return m, m.bias

    def choose_mode(self, batch=None):
        """The ModeChoice (mode, reason, estimated seconds) "auto" makes for `batch`
        images (None: 32); `mode` itself when it is not "auto"."""
        if self.mode != "auto":
            return fuse_train.ModeChoice(self.mode, "requested", {})
        key = (batch, self.trainable)
        if key not in self._choices:
            self._choices[key] = fuse_train.choose_mode(
                self.program, dict(self.weight_shapes), self.input_size, self.channels, batch,
                self.trainable, self.algorithm, self.workspace_limit)
        return self._choices[key]

    def call(self, inputs):
        if self.choose_mode(inputs.shape[0]).mode == "recompute":
            return fuse_train.run_recompute(inputs, self.program, dict(self.branch_weights),
                                            self.algorithm, self.workspace_limit)
        m, bias = self.fused()
        return fuse.apply_fused(inputs, m, bias, self.algorithm, self.workspace_limit,
                                self.program, dict(self.branch_weights))

    def get_config(self):
        config = super().get_config()
        config.update(program=self.program, weight_shapes=self.weight_shapes,
                      input_size=list(self.input_size), channels=self.channels,
                      algorithm=self.algorithm, workspace_limit=self.workspace_limit,
                      mode=self.mode)
        return config


def _check_mode(mode):
    if not isinstance(mode, str) or mode not in fuse_train.MODES:
        raise ValueError(f"Invalid value for argument `mode`: expected one of "
                         f"{fuse_train.MODES}. Received mode={mode!r}")
    return mode


@keras.saving.register_keras_serializable(package="tfbigconv")
class FusedBiasMap(keras.layers.Layer):
    """Adds a fixed [height, width, channels] bias map: the exact bias of a fused
    subgraph whose biases meet zero padding (made by `tfbigconv.fuse_linear`)."""

    def __init__(self, shape, **kwargs):
        super().__init__(**kwargs)
        self.shape = tuple(int(d) for d in shape)

    def build(self, input_shape):
        self.bias_map = self.add_weight(name="bias_map", shape=self.shape, initializer="zeros",
                                        trainable=False)
        self.built = True

    def call(self, inputs):
        return inputs + tf.cast(self.bias_map, inputs.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(shape=list(self.shape))
        return config
