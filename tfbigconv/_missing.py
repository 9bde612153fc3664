"""Stand-ins for the compiled modules (_core, the op library) when they did not load.

tfbigconv then runs bigconv2d and its Keras layers as pure TensorFlow
(pure_tf/). Modules keep their `from tfbigconv import _core` imports;
what needs the compiled code raises ImportError naming the cause and the
rebuild command when it is used, not when tfbigconv is imported.
"""
import sys
import types

REBUILD_COMMAND = "pip install --no-build-isolation --force-reinstall --no-deps ."


def message(what, cause):
    return (f"{what} needs tfbigconv's compiled library, which did not load ({cause}). "
            f"bigconv2d and the Keras layers run as pure TensorFlow meanwhile. Rebuild the "
            f"library against the installed TensorFlow from tfbigconv's source directory "
            f"with: {REBUILD_COMMAND}")


class Missing(types.ModuleType):
    """Any attribute is another stand-in; calling one raises ImportError."""

    def __init__(self, name, cause):
        super().__init__(name)
        self._cause = cause

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.__name__}.{attr}", self._cause)

    def __call__(self, *args, **kwargs):
        raise ImportError(message(self.__name__, self._cause))

    def __repr__(self):
        return f"<missing {self.__name__}: {self._cause}>"


def install(package, names, cause):
    """Puts stand-ins for package.<name> in place (module attribute and sys.modules)."""
    for name in names:
        full = f"{package.__name__}.{name}"
        stand_in = Missing(full, cause)
        sys.modules[full] = stand_in
        setattr(package, name, stand_in)
