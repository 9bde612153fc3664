"""A Keras flavour: Keras 3 (`keras`) or Keras 2 (`tf_keras`), one `Flavour` object each.

The Big and fused layers, convert_model, fuse_linear and memory_report are written
once against a flavour: `flavour.keras` (the Keras module), `flavour.layers`
(tfbigconv's layers for it, made here from LAYER_CLASSES and importable from
`flavour.module`), and what differs between the two: the layers' backend check,
the depthwise kernel's name, whether Keras reads `supports_jit`, how a functional
model's graph of layer calls is read and replayed, the base classes of its
convolution layers (`conv_bases`), how a model is cloned (tf_keras' clone_model
does not recurse into nested models), and making an Input like another.

tf-keras stays optional: a tf_keras model means tf_keras is imported already, so
`of` looks only in sys.modules; the Keras 2 flavour (its layers registered with
tf_keras) is made by the first such model or by importing `tfbigconv.keras.keras2`.
"""
import dataclasses
import sys
import threading
import types
from typing import Optional

import keras
import tensorflow as tf

# Keras 3's convolution base classes: every convolution layer of the flavour is one.
from keras.src.layers.convolutional.base_conv import BaseConv
from keras.src.layers.convolutional.base_conv_transpose import BaseConvTranspose
from keras.src.layers.convolutional.base_depthwise_conv import BaseDepthwiseConv
from keras.src.layers.convolutional.base_separable_conv import BaseSeparableConv

from tfbigconv.keras.base import (BigConv1DLogic, BigConv2DLogic, BigConv3DLogic,
                                  BigDepthwiseConv1DLogic, BigDepthwiseConv2DLogic,
                                  BigDepthwiseConv3DLogic)
from tfbigconv.keras.fused import FusedBiasMapLogic, FusedLinearConvLogic

if int(keras.__version__.split(".")[0]) < 3:  # pragma: no cover - depends on the install
    raise ImportError(
        f"tfbigconv.keras needs Keras 3 (found keras {keras.__version__}); "
        "for Keras 2 use tfbigconv.keras.keras2 (pip install tf-keras)")

# The package name the layers are registered under ("tfbigconv>BigConv2D").
PACKAGE = "tfbigconv"


@dataclasses.dataclass(frozen=True)
class LayerClass:
    """One of tfbigconv's Keras layers, made in each flavour as `name`(logic, base).

      keras_layer: the flavour's Keras layer it subclasses, by its name in
        `keras.layers` ("Conv2D"); None for the flavour's rank-generic depthwise
        base (Keras has no DepthwiseConv3D).
    """
    name: str
    logic: type
    keras_layer: Optional[str]

    @property
    def replaces(self):
        """The Keras layer convert_model turns into this one ("Conv2D"), or None."""
        return self.keras_layer if self.name == f"Big{self.keras_layer}" else None


LAYER_CLASSES = (
    LayerClass("BigConv1D", BigConv1DLogic, "Conv1D"),
    LayerClass("BigConv2D", BigConv2DLogic, "Conv2D"),
    LayerClass("BigConv3D", BigConv3DLogic, "Conv3D"),
    LayerClass("BigDepthwiseConv1D", BigDepthwiseConv1DLogic, "DepthwiseConv1D"),
    LayerClass("BigDepthwiseConv2D", BigDepthwiseConv2DLogic, "DepthwiseConv2D"),
    LayerClass("BigDepthwiseConv3D", BigDepthwiseConv3DLogic, None),
    LayerClass("FusedLinearConv", FusedLinearConvLogic, "Layer"),
    LayerClass("FusedBiasMap", FusedBiasMapLogic, "Layer"),
)


class Call:
    """One call of a layer in a functional model: the layer, its input and output
    symbolic tensors (flat lists), and the flavour's node for replaying it."""

    def __init__(self, layer, inputs, outputs, node):
        self.layer, self.inputs, self.outputs, self.node = layer, inputs, outputs, node


class Flavour:
    """One Keras flavour. Class attributes (known without the flavour's Keras):

      name: "Keras 3" or "Keras 2 (tf_keras)".
      package: the flavour's Python package ("keras" or "tf_keras").
      module: where its tfbigconv layers are imported from.
      depthwise_kernel: the depthwise layers' kernel attribute ("kernel" in
        Keras 3, "depthwise_kernel" in tf_keras).
      declares_jit: whether the flavour reads the layers' `supports_jit` (Keras 3
        does; tf_keras has no such flag).

    An instance holds the flavour's Keras module (`keras`), its saving module
    (`saving`: register_keras_serializable, get_custom_objects,
    get_registered_name), its rank-generic depthwise base (`depthwise_base`),
    `conv_bases`, `classes`, the classes of LAYER_CLASSES made on its Keras and
    registered (package "tfbigconv"), and `layers`, what its layer module
    exports (the classes by name, and `BaseDepthwiseConv`). Subclasses add
    reading and rebuilding its models (functional, calls, replay, input_like,
    structures, pack, clone_model)."""

    name = package = module = depthwise_kernel = None
    declares_jit = False

    def __init__(self, keras_module, saving, depthwise_base, conv_bases):
        self.keras, self.saving = keras_module, saving
        self.depthwise_base, self.conv_bases = depthwise_base, conv_bases
        self.classes = tuple(self._make(c) for c in LAYER_CLASSES)
        # What its layer module exports: the classes, and the depthwise base by the
        # name that module gives it.
        self.layers = types.SimpleNamespace(**{c.__name__: c for c in self.classes},
                                            BaseDepthwiseConv=depthwise_base)

    def _make(self, layer_class):
        base = (self.depthwise_base if layer_class.keras_layer is None
                else getattr(self.keras.layers, layer_class.keras_layer))

        def body(namespace):
            namespace.update(__module__=self.module, __qualname__=layer_class.name,
                             __doc__=layer_class.logic.__doc__, _flavour=self)

        cls = types.new_class(layer_class.name, (layer_class.logic, base), exec_body=body)
        return self.saving.register_keras_serializable(package=PACKAGE)(cls)

    def register(self):
        """Puts the layers in the flavour's registry again where they are missing
        (e.g. after it was cleared); returns their registered names."""
        custom_objects, names = self.saving.get_custom_objects(), []
        for cls in self.classes:
            name = self.saving.get_registered_name(cls)
            if custom_objects.get(name) is not cls:
                custom_objects[name] = cls
            names.append(name)
        return names

    def check_backend(self):
        """Raises where the flavour cannot run TensorFlow ops."""

    def check_tensor(self, layer_name, tensor):
        """A layer of this flavour called on the other flavour's tensor fails deep in
        Keras with a message that does not say why: a TypeError naming the import
        that gives the right layer."""
        package = type(tensor).__module__.split(".")[0]
        theirs = next((f for f in (Keras3, Keras2) if f.package == package), None)
        if theirs is not None and theirs.package != self.package:
            raise TypeError(
                f"{layer_name} of {self.module} is a {self.name} layer, called on a "
                f"{theirs.name} tensor; for {theirs.name} models use "
                f"`from {theirs.module} import {layer_name}` (`tfbigconv.keras` gives "
                f"the layers of the Keras that `tf.keras` is)")


class Keras3(Flavour):
    name, package, module = "Keras 3", "keras", "tfbigconv.keras.layers"
    depthwise_kernel, declares_jit = "kernel", True

    def __init__(self):
        super().__init__(keras, keras.saving, BaseDepthwiseConv,
                         (BaseConv, BaseConvTranspose, BaseDepthwiseConv, BaseSeparableConv))

    def check_backend(self):
        if keras.backend.backend() != "tensorflow":
            raise ValueError(
                "tfbigconv's Keras layers run TensorFlow ops and need the TensorFlow backend; "
                f"the Keras backend is {keras.backend.backend()!r} (set KERAS_BACKEND=tensorflow)")

    def functional(self, model):
        """The functional model that runs `model`, or None (subclassed, unbuilt)."""
        functional = model._functional if isinstance(model, keras.Sequential) else model
        return functional if hasattr(functional, "_nodes_by_depth") else None

    def calls(self, functional):
        """The model's layer calls, in execution order."""
        return [Call(node.operation, list(node.input_tensors), list(node.output_tensors), node)
                for depth in sorted(functional._nodes_by_depth, reverse=True)
                for node in functional._nodes_by_depth[depth]
                if node.operation is not None and not node.is_input]

    def replay(self, call, layer, tensors):
        """Calls `layer` as `call` called its layer, on tensors[id(original input)];
        returns the flat outputs."""
        args, kwargs = call.node.arguments.fill_in(tensors)
        return keras.tree.flatten(layer(*args, **kwargs))

    def input_like(self, x):
        return keras.Input(batch_shape=x.shape, dtype=x.dtype, name=x.name)

    def structures(self, functional):
        """(inputs, outputs) as nested as the model takes and gives them."""
        return functional._inputs_struct, functional._outputs_struct

    def pack(self, structure, flat):
        return keras.tree.pack_sequence_as(structure, flat)

    def clone_model(self, model, clone_function):
        """Clones `model`, nested models included, calling clone_function on each
        other layer; raises ValueError for a model that cannot be cloned."""
        return keras.models.clone_model(model, clone_function=clone_function, recursive=True)


class Keras2(Flavour):
    name, package, module = "Keras 2 (tf_keras)", "tf_keras", "tfbigconv.keras.keras2"
    depthwise_kernel, declares_jit = "depthwise_kernel", False

    def __init__(self, tf_keras):
        from tf_keras.src.layers.convolutional.base_conv import Conv
        from tf_keras.src.layers.convolutional.base_depthwise_conv import DepthwiseConv
        # Conv: tf_keras' depthwise, separable and transposed layers are Convs too.
        super().__init__(tf_keras, tf_keras.utils, DepthwiseConv, (Conv,))

    def functional(self, model):
        # A Sequential with an input is itself a functional model in tf_keras.
        return model if getattr(model, "_is_graph_network", False) else None

    def calls(self, functional):
        return [Call(node.layer, list(node.keras_inputs), tf.nest.flatten(node.outputs), node)
                for depth in sorted(functional._nodes_by_depth, reverse=True)
                for node in functional._nodes_by_depth[depth] if not node.is_input]

    def replay(self, call, layer, tensors):
        # Node.map_arguments takes one value per use of each input, keyed by str(id).
        uses = {}
        for x in call.inputs:
            uses.setdefault(str(id(x)), []).append(tensors[id(x)])
        args, kwargs = call.node.map_arguments(uses)
        return tf.nest.flatten(layer(*args, **kwargs))

    def input_like(self, x):
        return self.keras.Input(batch_size=x.shape[0], shape=x.shape[1:], dtype=x.dtype,
                                name=x._keras_history.layer.name)

    def structures(self, functional):
        return functional._nested_inputs, functional._nested_outputs

    def pack(self, structure, flat):
        return tf.nest.pack_sequence_as(structure, flat)

    def clone_model(self, model, clone_function):
        def clone(layer):  # Keras 3's recursive=True, which tf_keras' clone_model lacks
            if isinstance(layer, self.keras.Model) and self.functional(layer) is not None:
                return self.keras.models.clone_model(layer, clone_function=clone)
            return clone_function(layer)
        return self.keras.models.clone_model(model, clone_function=clone)


KERAS3 = Keras3()
_keras2 = []  # the Keras 2 flavour, once made
_keras2_lock = threading.Lock()  # made once: registering its layers twice would fail


def tf_keras_flavour(tf_keras):
    """The Keras 2 flavour on module `tf_keras`, made (its layers registered) at the
    first call."""
    with _keras2_lock:
        if not _keras2:
            _keras2.append(Keras2(tf_keras))
    return _keras2[0]


def made():
    """The flavours made so far: Keras 3's, and Keras 2's once tf_keras is in use."""
    return [KERAS3, *_keras2]


def of(model):
    """The flavour of Keras model `model`; ValueError naming `model` if it is none."""
    if isinstance(model, keras.Model):
        return KERAS3
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None and isinstance(model, tf_keras.Model):
        return tf_keras_flavour(tf_keras)
    raise ValueError("Invalid value for argument `model`: expected a Keras model (Keras 3 or "
                     f"tf_keras), received {type(model).__name__}")
