"""convert_model: tfbigconv's layers in place of Keras' own in an existing Keras
model (Keras 3 or tf_keras), wherever they sit, and a report of what was converted
and what could not be."""
import dataclasses
import warnings

from tfbigconv.keras import flavours
from tfbigconv.keras.base import check_options
from tfbigconv.large_kernels import is_large, min_kernel_size as parse_min_kernel_size

# Exact Keras classes -> their tfbigconv counterparts, by name in the model's
# flavour. Subclasses of Conv2D are left alone (and reported): they may override
# call() with something else.
_REPLACEMENTS = {c.replaces: c.name for c in flavours.LAYER_CLASSES if c.replaces}


@dataclasses.dataclass(frozen=True)
class ConvLayer:
    """One large convolution layer convert_model found.

      path: the layer names from the model down to it, "/"-joined
        ("stage1/block0/large_conv/depthwise").
      layer: its class name before conversion ("DepthwiseConv2D").
      kernel_size: its kernel size, e.g. (31, 31).
      reason: why it was not converted ("" if it was).
      in_custom_layer: whether it sits inside a custom layer or subclassed model, whose
        config may rebuild it as Keras' own layer when the model is loaded (then
        convert the loaded model again).
    """
    path: str
    layer: str
    kernel_size: tuple
    reason: str = ""
    in_custom_layer: bool = False

    def __str__(self):
        size = "x".join(str(k) for k in self.kernel_size)
        return f"{self.path} ({self.layer}, {size})" + (f": {self.reason}" if self.reason else "")


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What `convert_model(..., report=True)` converted (`converted`) and which
    convolutions with kernels of at least `min_kernel_size` it left as they were
    (`not_converted`, each with its reason); `ConvLayer`s in the model's layer order."""
    converted: tuple
    not_converted: tuple
    min_kernel_size: tuple

    def __str__(self):
        h, w = self.min_kernel_size
        lines = [f"convert_model: converted {len(self.converted)} convolution layer(s) with "
                 f"kernels of at least {h}x{w}"]
        lines += [f"  {c}" for c in self.converted]
        inside = sum(c.in_custom_layer for c in self.converted)
        if inside:
            lines.append(f"  ({inside} inside custom layers or subclassed models, which build "
                         "Keras' own layers when loaded: to load the model saved, rebuild it, "
                         "convert it, then load_weights)")
        if self.not_converted:
            lines.append(f"not converted: {len(self.not_converted)}")
            lines += [f"  {c}" for c in self.not_converted]
        return "\n".join(lines)


def _sublayers(root, flavour):
    """(path, layer, in_custom_layer) for every layer under `root`, each once, parents
    first: attributes, lists and dicts of layers, nested and subclassed models."""
    seen = {id(root)}

    def visit(layer, prefix, custom):
        # A layer's own layers survive saving when it is a Functional or Sequential model
        # (they are saved by class); a custom layer or subclassed model rebuilds them.
        inner_custom = custom or flavour.functional(layer) is None
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if id(child) not in seen:
                seen.add(id(child))
                path = f"{prefix}/{child.name}" if prefix else child.name
                yield path, child, inner_custom
                yield from visit(child, path, inner_custom)

    yield from visit(root, "", False)


def _convert_in_place(model, flavour, min_size, algorithm, workspace_limit):
    """Converts every exact stock convolution layer under `model` whose kernel is at
    least min_size; returns the ConversionReport."""
    replacements = {getattr(flavour.keras.layers, name): getattr(flavour.layers, big)
                    for name, big in _REPLACEMENTS.items()}
    ours = flavour.classes
    converted, not_converted = [], []
    for path, layer, custom in _sublayers(model, flavour):
        if not isinstance(layer, flavour.conv_bases) or isinstance(layer, ours):
            continue
        size = tuple(int(k) for k in layer.kernel_size)
        if not is_large(size, min_size):
            continue
        found = ConvLayer(path, type(layer).__name__, size, in_custom_layer=custom)
        big = replacements.get(type(layer))
        if big is not None:
            big.convert_in_place(layer, algorithm, workspace_limit)
            converted.append(found)
            continue
        # The nearest Keras class: the layer's own, or the one a user's class subclasses.
        keras_class = next(cls for cls in type(layer).__mro__
                           if cls.__module__.split(".")[0] in ("keras", "tf_keras"))
        if keras_class is type(layer):
            reason = f"tfbigconv has no layer for {keras_class.__name__}"
        elif keras_class in replacements:
            reason = (f"a subclass of {keras_class.__name__}, whose call may differ from Keras'; "
                      f"build it on {_big_name(flavour, keras_class)} instead")
        else:
            reason = (f"a subclass of {keras_class.__name__}, which tfbigconv has no layer for")
        not_converted.append(dataclasses.replace(found, reason=reason))
    return ConversionReport(tuple(converted), tuple(not_converted), min_size)


def _big_name(flavour, stock):
    """The import path of the Big layer for Keras class `stock`."""
    return f"{flavour.module}.{_REPLACEMENTS[stock.__name__]}"


def _copy(model, flavour):
    """A copy of a Functional or Sequential model (nested ones too) with the same weights."""
    if not model.built:
        raise ValueError("Invalid value for argument `model`: the model is not built, so it has "
                         "no weights to copy; build it (call it on data or give it an Input), "
                         "or pass in_place=True.")
    pairs = []  # (original layer, its clone), to copy the weights once built

    def clone(layer):
        new = layer.__class__.from_config(layer.get_config())
        pairs.append((layer, new))
        return new

    try:
        copied = flavour.clone_model(model, clone)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise ValueError(f"Invalid value for argument `model`: Keras cannot copy it ({e}); "
                         "pass in_place=True to convert the model itself") from e
    for old, new in pairs:
        if not new.built and old.weights:
            raise ValueError(f"convert_model: layer {old.name!r} was not rebuilt by the clone; "
                             "its weights cannot be copied (pass in_place=True)")
        new.set_weights(old.get_weights())
    return copied


def convert_model(model, min_kernel_size=15, *, algorithm="auto", workspace_limit=0,
                  in_place=False, report=False):
    """Makes `model`'s large-kernel convolution layers run on tfbigconv, wherever they sit.

    Every `keras.layers.Conv1D`, `Conv2D`, `Conv3D` (also grouped, which
    TensorFlow's CPU Conv3D refuses), `DepthwiseConv1D` and `DepthwiseConv2D`
    (exactly those classes) whose kernel is at least `min_kernel_size` (in both
    height and width; a 1-D kernel's length against the width; a 3-D kernel's
    depth is not compared) becomes the Big layer of the same name, in place: the
    same object, with the same configuration (name, dtype policy, trainable,
    initializers, ...) and the same variables. The layers are found wherever
    Keras tracks them: in Functional and Sequential models, in custom layers'
    attributes, lists and dicts, in models nested in those, in subclassed models.
    The result computes the same function as before (up to floating-point
    rounding). A tf_keras (Keras 2) model gets the layers of
    `tfbigconv.keras.keras2`.

    By default (`in_place=False`) `model` is not changed: a copy is converted and
    returned, uncompiled (a Functional or Sequential model, whose layers Keras
    clones from their configs, with the weights copied). With `in_place=True`,
    `model` itself is converted and returned; that works for every model,
    subclassed ones and custom layers without a usable config included, keeps
    its variables, so a compiled model keeps its optimizer state, and its
    train, test and predict functions are traced again on their next call.

    Not converted, and listed in the report with the reason: subclasses of those
    classes (their `call` may differ; build them on the Big layers instead) and
    convolution layers tfbigconv has no layer for (transposed, separable). Raw
    `tf.nn` or `keras.ops` convolutions inside a layer's `call` are no layers at
    all; `tfbigconv.route` reaches those. When large convolutions exist and
    none was converted, a RuntimeWarning says so.

    Saving: converted layers in Functional and Sequential models are saved and
    loaded as Big layers. A custom layer or subclassed model builds its own
    layers when loaded, as Keras' own (`ConvLayer.in_custom_layer` in the
    report): there `keras.models.load_model` gives Keras' layers or fails
    (Keras saves layers held in lists and dicts under their class names). So
    load such a model as converted: build it (from its code, or `load_model` of
    a file saved before the conversion), convert it, then
    `model.load_weights(path)` (a `.keras` or `.weights.h5` file).

    Args:
      model: a Keras model, Keras 3 or tf_keras; built, unless `in_place=True`.
      min_kernel_size: int, or (height, width): the smallest kernel converted
        (1-D kernels: their length against the width).
        Default 15, where tfbigconv starts to pay off.
      algorithm, workspace_limit: passed to every converted layer (see
        `tfbigconv.keras.BigConv2D`).
      in_place: convert `model` itself instead of a copy.
      report: also return a `ConversionReport`.

    Returns:
      The converted model, or `(model, ConversionReport)` with `report=True`.

    Raises:
      ValueError: a bad argument (named), or, without `in_place`, a model
        Keras cannot copy.
    """
    min_size = parse_min_kernel_size(min_kernel_size)
    algorithm, workspace_limit = check_options(algorithm, workspace_limit)
    flavour = flavours.of(model)
    converted = model if in_place else _copy(model, flavour)
    result = _convert_in_place(converted, flavour, min_size, algorithm, workspace_limit)
    if in_place and result.converted:
        for _, layer, _ in [("", model, False), *_sublayers(model, flavour)]:
            if isinstance(layer, flavour.keras.Model):  # traced with the old classes
                layer.train_function = layer.test_function = layer.predict_function = None
    if result.not_converted and not result.converted:
        h, w = min_size
        warnings.warn(f"convert_model converted none of the {len(result.not_converted)} "
                      f"convolution layer(s) with kernels of at least {h}x{w}:\n"
                      + "\n".join(f"  {c}" for c in result.not_converted),
                      RuntimeWarning, stacklevel=2)
    return (converted, result) if report else converted
