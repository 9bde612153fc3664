"""Builds tfbigconv's TensorFlow op library and its _core module with CMake.

Install with:  pip install --no-build-isolation .
The ops must be compiled against the TensorFlow that will load them, so the
build imports the installed TensorFlow; an isolated build environment has none.
"""
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

NO_TF_MESSAGE = (
    "tfbigconv must be built against the installed TensorFlow, which this build "
    "environment cannot import. Install TensorFlow first, then run:\n"
    "    pip install --no-build-isolation .\n"
)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run(self):
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            sys.exit("error: " + NO_TF_MESSAGE)
        super().run()

    def build_extension(self, ext):
        src = os.path.abspath(os.path.dirname(__file__))
        out_dir = os.path.abspath(os.path.join(self.build_lib, "tfbigconv"))
        build_temp = os.path.abspath(self.build_temp)
        os.makedirs(build_temp, exist_ok=True)
        cfg = [
            "-S", src, "-B", build_temp,
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_INSTALL_PREFIX={os.path.dirname(out_dir)}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        try:
            import ninja  # noqa: F401
            cfg += ["-G", "Ninja"]
        except ImportError:
            pass
        cfg += os.environ.get("TFBIGCONV_CMAKE_ARGS", "").split()
        subprocess.check_call(["cmake"] + cfg)
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build_temp, "--parallel", jobs])
        subprocess.check_call(["cmake", "--install", build_temp])
        write_build_info(out_dir)


def write_build_info(package_dir):
    """Records the TensorFlow the ops are compiled against; tfbigconv/_ops.py checks it."""
    import tensorflow as tf
    with open(os.path.join(package_dir, "_build_info.py"), "w") as f:
        f.write('"""Written by setup.py at build time; checked by tfbigconv/_ops.py at import."""\n')
        f.write(f"TF_VERSION = {tf.__version__!r}\n")
        f.write(f"TF_GIT_VERSION = {tf.version.GIT_VERSION!r}\n")


# Fail fast under build isolation: without TensorFlow nothing can be built.
if any(a.startswith(("bdist_wheel", "build", "install", "egg_info", "dist_info")) for a in sys.argv[1:]):
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        sys.exit("error: " + NO_TF_MESSAGE)

setup(
    name="tfbigconv",
    version="0.1.0",
    description="Fast, memory-bounded 1-D, 2-D and 3-D convolution with large filters for TensorFlow",
    packages=find_packages(include=["tfbigconv", "tfbigconv.*"]),
    package_data={"tfbigconv.cost_model": ["cost_model*.json"]},  # the shipped calibrations
    ext_modules=[CMakeExtension("tfbigconv._bigconv_ops")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={
        "plot": ["matplotlib"],  # MemoryReport.plot / to_tensorboard
        # model.export(format="litert" / "onnx") inside tfbigconv.portable(), and their runtimes
        "export": ["ai-edge-litert", "tf2onnx", "onnx", "onnxruntime"],
    },
    zip_safe=False,
)
