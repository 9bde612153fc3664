"""convert_model: swap tfbigconv's layers into an existing Keras model."""
import numbers

import keras

from tfbigconv.keras.layers import (BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
                                    BigDepthwiseConv2D, check_options)

# Exact Keras classes -> their tfbigconv counterparts. Subclasses of Conv2D are
# left alone: they may override call() with something else.
_REPLACEMENTS = {
    keras.layers.Conv1D: BigConv1D,
    keras.layers.Conv2D: BigConv2D,
    keras.layers.Conv3D: BigConv3D,
    keras.layers.DepthwiseConv1D: BigDepthwiseConv1D,
    keras.layers.DepthwiseConv2D: BigDepthwiseConv2D,
}


def _min_size(min_kernel_size):
    value = min_kernel_size
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    try:
        h, w = value
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1
                 for v in (h, w))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError("Invalid value for argument `min_kernel_size`: expected a positive int "
                         f"or a pair of them (height, width). Received "
                         f"min_kernel_size={min_kernel_size!r}")
    return int(h), int(w)


def convert_model(model, min_kernel_size=15, *, algorithm="auto", workspace_limit=0):
    """Returns a copy of `model` whose large-kernel convolutions run on tfbigconv.

    Every `keras.layers.Conv1D`, `Conv2D`, `Conv3D` (also grouped, which
    TensorFlow's CPU Conv3D refuses), `DepthwiseConv1D` and `DepthwiseConv2D`
    (exactly those classes, also inside nested Sequential/Functional models)
    whose kernel is at least `min_kernel_size` (in both height and width; a 1-D
    kernel's length against the width; a 3-D kernel's depth is not compared) becomes
    the Big layer of the same name with the same configuration (name,
    dtype policy, trainable, initializers, ...) and the same weights. All other
    layers are cloned with their weights. The result computes the same
    function as `model` (up to floating-point rounding); `model` is not
    changed.

    Args:
      model: a built Functional or Sequential Keras model. Subclassed models
        cannot be cloned by Keras; construct them with tfbigconv's layers.
      min_kernel_size: int, or (height, width): the smallest kernel converted
        (1-D kernels: their length against the width).
        Default 15, where tfbigconv starts to pay off.
      algorithm, workspace_limit: passed to every converted layer (see
        `tfbigconv.keras.BigConv2D`).

    Returns:
      A new, uncompiled Keras model (compile it again to train; optimizer
      state is not copied).

    Raises:
      ValueError: a bad argument (named), or a model that cannot be cloned.
    """
    min_h, min_w = _min_size(min_kernel_size)
    algorithm, workspace_limit = check_options(algorithm, workspace_limit)
    if not isinstance(model, keras.Model):
        raise ValueError("Invalid value for argument `model`: expected a Keras model, received "
                         f"{type(model).__name__}")
    if not model.built:
        raise ValueError("Invalid value for argument `model`: the model is not built, so it has "
                         "no weights to copy; build it (call it on data or give it an Input).")

    pairs = []  # (original layer, its clone), to copy the weights once built

    def clone(layer):
        big = _REPLACEMENTS.get(type(layer))
        size = tuple(layer.kernel_size) if big is not None else ()
        if big is not None and size[-1] >= min_w and (len(size) == 1 or size[-2] >= min_h):
            config = layer.get_config()
            config.update(algorithm=algorithm, workspace_limit=workspace_limit)
            new = big.from_config(config)
        else:
            new = layer.__class__.from_config(layer.get_config())
        pairs.append((layer, new))
        return new

    # Subclassed models make clone_model raise a ValueError that says so.
    converted = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for old, new in pairs:
        if not new.built and old.weights:
            raise ValueError(f"convert_model: layer {old.name!r} was not rebuilt by the clone; "
                             "its weights cannot be copied")
        new.set_weights(old.get_weights())
    return converted
