"""Loads the compiled op library. Importing tfbigconv registers the ops.

Custom ops must run under the TensorFlow they were compiled against: the build
records that version in `_build_info.py` (written by setup.py next to the
library), and loading refuses a different one with the command to rebuild,
instead of an obscure undefined-symbol error or a crash inside TensorFlow.
"""
import os

import tensorflow as tf

_DIR = os.path.dirname(os.path.abspath(__file__))
LIB_PATH = os.path.join(_DIR, "_bigconv_ops.so")

REBUILD_COMMAND = "pip install --no-build-isolation --force-reinstall --no-deps ."
# Set to 1 to load the ops under another TensorFlow anyway (at your own risk).
SKIP_CHECK_ENV = "TFBIGCONV_SKIP_VERSION_CHECK"

try:
    from tfbigconv._build_info import TF_VERSION as BUILT_TF_VERSION
except ImportError:  # a build that did not go through setup.py (e.g. CMake by hand)
    BUILT_TF_VERSION = None


def version_mismatch_message(built, installed):
    """The error text for ops built against TF `built` imported under TF `installed`."""
    return (
        f"tfbigconv's ops were built against TensorFlow {built}, but TensorFlow {installed} is "
        f"installed. Custom ops must be compiled against the TensorFlow that loads them. Rebuild "
        f"tfbigconv for TensorFlow {installed} from its source directory with:\n"
        f"    {REBUILD_COMMAND}\n"
        f"(or `make install`), or install TensorFlow {built}. "
        f"Setting {SKIP_CHECK_ENV}=1 skips this check.")


def check_tf_version(built=BUILT_TF_VERSION, installed=tf.__version__):
    """Raises ImportError when the ops were built against another TensorFlow."""
    if built is None or built == installed or os.environ.get(SKIP_CHECK_ENV) == "1":
        return
    raise ImportError(version_mismatch_message(built, installed))


check_tf_version()

try:
    ops = tf.load_op_library(LIB_PATH)
except (tf.errors.NotFoundError, OSError) as e:  # pragma: no cover - build problem
    raise ImportError(
        f"tfbigconv could not load its op library {LIB_PATH}: {e}\n"
        f"Rebuild it against the installed TensorFlow {tf.__version__} with: {REBUILD_COMMAND}"
    ) from e
