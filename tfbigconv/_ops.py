"""Loads the compiled op library. Importing tfbigconv registers the ops."""
import os

import tensorflow as tf

_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bigconv_ops.so")

try:
    ops = tf.load_op_library(_LIB_PATH)
except (tf.errors.NotFoundError, OSError) as e:  # pragma: no cover - build problem
    raise ImportError(
        f"tfbigconv could not load its op library {_LIB_PATH}: {e}\n"
        "Rebuild it against the installed TensorFlow with: pip install --no-build-isolation ."
    ) from e
