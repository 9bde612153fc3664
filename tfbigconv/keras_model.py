"""Which Keras a model is, and cloning it: what memory/ and keras/ both need,
below both. Keras 3 (`keras`) is TensorFlow's dependency; tf_keras stays
optional: a tf_keras model means it is imported already, so only sys.modules
is read."""
import sys

import keras


def keras_of(model):
    """The Keras module `model` is a model of: keras (Keras 3), tf_keras
    (Keras 2), or None for neither."""
    if isinstance(model, keras.Model):
        return keras
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None and isinstance(model, tf_keras.Model):
        return tf_keras
    return None


def clone_model(model, clone_function):
    """Clones a Keras 3 or tf_keras `model`, nested functional models included,
    calling clone_function on each other layer (Keras 3's recursive=True,
    which tf_keras' clone_model lacks); ValueError for one that cannot be
    cloned (a subclassed model)."""
    k = keras_of(model)
    if k is None:
        raise ValueError(f"clone_model: model must be a Keras model, got {type(model).__name__}")
    if k is keras:
        return keras.models.clone_model(model, clone_function=clone_function, recursive=True)

    def clone(layer):
        if isinstance(layer, k.Model) and getattr(layer, "_is_graph_network", False):
            return k.models.clone_model(layer, clone_function=clone)
        return clone_function(layer)
    return k.models.clone_model(model, clone_function=clone)
