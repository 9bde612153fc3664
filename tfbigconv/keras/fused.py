"""The logic of the two layers fuse_linear makes, written once for both Keras
flavours (as `tfbigconv.keras.base` is for the Big layers): FusedLinearConv (a
linear subgraph run as one convolution, trainable) and FusedBiasMap (its biases
where they meet zero padding). The thin classes are in `tfbigconv.keras.layers`
(Keras 3) and `tfbigconv.keras.keras2` (tf_keras); the math they run is
`tfbigconv.fusion` (program: the subgraph's steps; train: the two modes)."""
import tensorflow as tf

from tfbigconv.fusion import program as steps, train
from tfbigconv.keras.base import check_options, declares_jit


def check_mode(mode):
    if not isinstance(mode, str) or mode not in train.MODES:
        raise ValueError(f"Invalid value for argument `mode`: expected one of "
                         f"{train.MODES}. Received mode={mode!r}")
    return mode


def _plain(value):
    """`value` as plain dicts, lists and numbers: tf_keras wraps lists and dicts set
    on a layer in its tracking types, which its configs should not carry."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _Choices(dict):
    """(batch, trainable) -> the ModeChoice made. A dict subclass: tf_keras wraps a
    plain dict set on a layer for tracking, and its flattening sorts the keys,
    which fails on None (unknown batch) among ints."""


class FusedLinearConvLogic:
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

    _flavour = None  # set by the flavour's thin class (a tfbigconv.keras.flavours.Flavour)

    def __init__(self, program, weight_shapes, input_size, channels, algorithm="auto",
                 workspace_limit=0, mode="auto", **kwargs):
        super().__init__(**kwargs)
        self._flavour.check_backend()
        self.algorithm, self.workspace_limit = check_options(algorithm, workspace_limit)
        self.mode = check_mode(mode)
        self.program = [dict(step) for step in program]
        self.weight_shapes = [[name, [int(d) for d in shape]] for name, shape in weight_shapes]
        self.input_size = tuple(int(v) for v in input_size)
        self.channels = int(channels)
        if self._flavour.declares_jit:
            self.supports_jit = declares_jit()
        self.branch_weights = {}
        self._choices = _Choices()

    def build(self, input_shape):
        for name, shape in self.weight_shapes:
            self.branch_weights[name] = self.add_weight(name=name, shape=tuple(shape),
                                                        initializer="zeros")
        self.built = True

    def fused(self):
        """The composed (LinearMap, bias) from the current weights; bias is a vector,
        a bias map [out_h, out_w, channels], or None."""
        weights = dict(self.branch_weights)
        m = steps.compose_program(self.program, weights, self.input_size, self.channels,
                                  self.variable_dtype, patch_borders=True)
        if m.bias_padded and not m.patched:
            return m, steps.bias_map(self.program, weights, self.input_size, self.channels,
                                     self.variable_dtype)
        return m, m.bias

    def choose_mode(self, batch=None):
        """The ModeChoice (mode, reason, estimated seconds) "auto" makes for `batch`
        images (None: 32); `mode` itself when it is not "auto"."""
        if self.mode != "auto":
            return train.ModeChoice(self.mode, "requested", {})
        key = (batch, self.trainable)
        if key not in self._choices:
            self._choices[key] = train.choose_mode(
                self.program, dict(self.weight_shapes), self.input_size, self.channels, batch,
                self.trainable, self.algorithm, self.workspace_limit)
        return self._choices[key]

    def call(self, inputs):
        if self.choose_mode(inputs.shape[0]).mode == "recompute":
            return train.run_recompute(inputs, self.program, dict(self.branch_weights),
                                       self.algorithm, self.workspace_limit)
        m, bias = self.fused()
        return steps.apply_fused(inputs, m, bias, self.algorithm, self.workspace_limit,
                                 self.program, dict(self.branch_weights))

    def get_config(self):
        config = super().get_config()
        config.update(program=_plain(self.program), weight_shapes=_plain(self.weight_shapes),
                      input_size=list(self.input_size), channels=self.channels,
                      algorithm=self.algorithm, workspace_limit=self.workspace_limit,
                      mode=self.mode)
        return config


class FusedBiasMapLogic:
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
