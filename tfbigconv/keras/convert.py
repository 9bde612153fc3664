"""convert_model: swap tfbigconv's layers into an existing Keras model (Keras 3 or
tf_keras: the flavour's own layers in, the flavour's Big layers out)."""
import numbers

from tfbigconv.keras import flavours
from tfbigconv.keras.base import check_options

# Exact Keras classes -> their tfbigconv counterparts, by name in the model's
# flavour. Subclasses of Conv2D are left alone: they may override call() with
# something else.
_REPLACEMENTS = {name: "Big" + name for name in
                 ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D")}


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
    changed. A tf_keras (Keras 2) model gives a tf_keras model with the layers
    of `tfbigconv.keras.keras2`.

    Args:
      model: a built Functional or Sequential Keras model, Keras 3 or tf_keras. Subclassed models
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
    flavour = flavours.of(model)
    replacements = {getattr(flavour.keras.layers, name): getattr(flavour.layers, big)
                    for name, big in _REPLACEMENTS.items()}
    if not model.built:
        raise ValueError("Invalid value for argument `model`: the model is not built, so it has "
                         "no weights to copy; build it (call it on data or give it an Input).")

    pairs = []  # (original layer, its clone), to copy the weights once built

    def clone(layer):
        big = replacements.get(type(layer))
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
    converted = flavour.clone_model(model, clone)
    for old, new in pairs:
        if not new.built and old.weights:
            raise ValueError(f"convert_model: layer {old.name!r} was not rebuilt by the clone; "
                             "its weights cannot be copied")
        new.set_weights(old.get_weights())
    return converted
