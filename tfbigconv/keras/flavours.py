"""A model's Keras flavour, as convert_model and fuse_linear need it.

Keras 3 (`keras`) and Keras 2 (`tf_keras`) have the same public layers under
the same names, so the two functions are written once against `flavour.keras`
(the Keras module) and `flavour.layers` (tfbigconv's layers for it:
`tfbigconv.keras.layers` or `tfbigconv.keras.keras2`). What differs, and is
here: how a functional model's graph of layer calls is read and replayed, the
base classes of its convolution layers (`conv_bases`), how a model is cloned
(tf_keras' clone_model does not recurse into nested models), and making an
Input like another.

tf-keras stays optional: a tf_keras model means tf_keras is imported already, so
`of` looks only in sys.modules, and `tfbigconv.keras.keras2` is imported when
the first such model comes.
"""
import sys

import keras
import tensorflow as tf
# Keras 3's convolution base classes: every convolution layer of the flavour is one.
from keras.src.layers.convolutional.base_conv import BaseConv
from keras.src.layers.convolutional.base_conv_transpose import BaseConvTranspose
from keras.src.layers.convolutional.base_depthwise_conv import BaseDepthwiseConv
from keras.src.layers.convolutional.base_separable_conv import BaseSeparableConv

from tfbigconv.keras import layers as keras3_layers


class Call:
    """One call of a layer in a functional model: the layer, its input and output
    symbolic tensors (flat lists), and the flavour's node for replaying it."""

    def __init__(self, layer, inputs, outputs, node):
        self.layer, self.inputs, self.outputs, self.node = layer, inputs, outputs, node


class Keras3:
    name = "Keras 3"

    def __init__(self):
        self.keras, self.layers = keras, keras3_layers
        self.depthwise_kernel = keras3_layers.KERAS3.depthwise_kernel
        self.conv_bases = (BaseConv, BaseConvTranspose, BaseDepthwiseConv, BaseSeparableConv)

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


class Keras2:
    name = "Keras 2 (tf_keras)"

    def __init__(self):
        import tf_keras
        from tf_keras.src.layers.convolutional.base_conv import Conv

        from tfbigconv.keras import keras2
        self.keras, self.layers = tf_keras, keras2
        self.depthwise_kernel = keras2.KERAS2.depthwise_kernel
        self.conv_bases = (Conv,)  # tf_keras' depthwise, separable and transposed too

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
_keras2 = []  # made when the first tf_keras model comes


def of(model):
    """The flavour of Keras model `model`; ValueError naming `model` if it is none."""
    if isinstance(model, keras.Model):
        return KERAS3
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None and isinstance(model, tf_keras.Model):
        if not _keras2:
            _keras2.append(Keras2())
        return _keras2[0]
    raise ValueError("Invalid value for argument `model`: expected a Keras model (Keras 3 or "
                     f"tf_keras), received {type(model).__name__}")
