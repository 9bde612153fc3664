"""The two Keras flavours, for the tests that run under both (tests/keras,
tests/fusion): the `flavour` fixture is Keras 3 or Keras 2 (tf_keras), as
`Flavour(keras, big)`: the Keras module and tfbigconv's layers for it. The
tf_keras param skips where tf-keras is not installed (`make deps` installs it).

    from flavours import flavour  # noqa: F401  (the fixture)
"""
import pytest


class Flavour:
    def __init__(self, name, keras, big):
        self.name, self.keras, self.big = name, keras, big
        self.layers = keras.layers

    def __repr__(self):
        return self.name

    def weight_path(self, w):
        """A weight's layer/name: "conv/kernel" for Keras 3's path and tf_keras' "conv/kernel:0"."""
        return getattr(w, "path", None) or w.name.split(":")[0]

    def weight_name(self, w):
        """A weight's own name: "kernel" for Keras 3's "kernel" and tf_keras' "conv/kernel:0"."""
        return w.name.rsplit("/", 1)[-1].split(":")[0]


def load(name):
    """The flavour called `name` ("keras3" or "keras2"); skips without tf_keras."""
    if name == "keras2":
        tf_keras = pytest.importorskip("tf_keras")
        from tfbigconv.keras import keras2
        return Flavour(name, tf_keras, keras2)
    import keras
    from tfbigconv.keras import layers
    return Flavour(name, keras, layers)


@pytest.fixture(params=["keras3", "keras2"], scope="module")
def flavour(request):
    return load(request.param)
