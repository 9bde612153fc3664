"""Loading the op library (tfbigconv/_native.py): the ops must run under the
TensorFlow they were built against, and importing tfbigconv says how to
rebuild them when they were not."""
import pytest
import tensorflow as tf

from tfbigconv import _native
from conftest import run_python


def test_version_check_messages():
    _native.check_tf_version("2.21.0", "2.21.0")
    _native.check_tf_version(None, "2.21.0")  # not built by setup.py: nothing recorded
    with pytest.raises(ImportError) as e:
        _native.check_tf_version("2.20.0", "2.21.0")
    message = str(e.value)
    assert "built against TensorFlow 2.20.0" in message
    assert "TensorFlow 2.21.0 is installed" in message
    assert "pip install --no-build-isolation --force-reinstall --no-deps ." in message


def test_installed_build_matches_running_tensorflow():
    if _native.BUILT_TF_VERSION is None:
        pytest.skip("this tfbigconv was not built by setup.py, so it records no TF version")
    assert _native.BUILT_TF_VERSION == tf.__version__


def test_ops_of_another_tensorflow_are_not_loaded(tmp_path):
    """The recorded build version is replaced by another one before tfbigconv is
    imported: the ops are not loaded, import warns once with the versions and the
    rebuild command, and bigconv2d runs as pure TensorFlow (issue 39)."""
    fake_build = """
        import sys, types, warnings
        import tensorflow as tf
        fake = types.ModuleType("tfbigconv._build_info")
        fake.TF_VERSION = "2.3.0"
        sys.modules["tfbigconv._build_info"] = fake
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tfbigconv
        y = tfbigconv.bigconv2d(tf.ones((1, 5, 5, 1)), tf.ones((3, 3, 1, 1)), 1, "VALID")
        assert y.shape == (1, 3, 3, 1) and float(y[0, 0, 0, 0]) == 9.0
    """
    out = run_python(fake_build + """
        said = [str(w.message) for w in caught if "compiled library" in str(w.message)]
        assert len(said) == 1, said
        message = said[0]
        assert "built against TensorFlow 2.3.0" in message, message
        assert f"TensorFlow {tf.__version__} is installed" in message, message
        assert "pip install --no-build-isolation --force-reinstall --no-deps ." in message, message
        assert tfbigconv.pure_tf.missing_library
        print("ok")
    """, cwd=tmp_path)
    assert out.startswith("ok")
    # The documented escape hatch loads the ops anyway.
    out = run_python(fake_build + """
        assert not caught, [str(w.message) for w in caught]
        assert tfbigconv.pure_tf.missing_library is None
        print("ok")
    """, cwd=tmp_path, env={"TFBIGCONV_SKIP_VERSION_CHECK": "1"})
    assert out.startswith("ok")
