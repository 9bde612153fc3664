"""memory_report(): the entry point. A Keras 3 or Keras 2 (tf_keras) model is
traced (trace.Trace) and its step simulated with synthesized gradients; a
tf.function, a ConcreteFunction or a TF1 tf.Graph holds its gradients as ops
and is simulated as it runs (graph.GraphTrace)."""
import tensorflow as tf

from tfbigconv import host
from tfbigconv.keras_model import keras_of
from tfbigconv.memory.graph import GraphTrace
from tfbigconv.memory.report import MemoryReport
from tfbigconv.memory.trace import Trace


def memory_report(model, batch_size=None, training=True, optimizer=None, device=None, *,
                  budget=None, input_shape=None, advice=True, fetches=None, scope_depth=None):
    """Which tensors a step keeps, its simulated peak, and what to change.

    Args:
      model: what runs the step, one of:
        - a built Keras model, Keras 3 or Keras 2 (tf_keras): Sequential,
          functional, or subclassed (a subclassed one needs `input_shape`);
        - a tf.function with an input_signature, or a ConcreteFunction: a
          training step (tf.GradientTape, an optimizer's apply_gradients) or
          any step; its gradient and update ops are in its graph;
        - a TF1 tf.Graph, with `fetches`: what one session run fetches (the
          train op of an optimizer's minimize, the loss).
      batch_size: the batch to report on (positive int): the size of the
        unknown (None) dimensions of the inputs' shapes. A graph's other
        tensors are sized as TensorFlow's shape inference sizes them at that
        batch (GraphTrace.size_unknown_dims; a note names any it cannot).
        A graph whose input shapes are all known needs none.
      training: True for a training step (forward, the loss, backward,
        optimizer update); False for inference (the forward pass only: no
        loss, the outputs alive to the end). Keras models only: a graph's
        step is what its ops are.
      optimizer: a Keras optimizer or its name, for its slot variables
        (default: the model's compiled optimizer; none: plain SGD). Keras
        models only: a graph's slots are the variables only its update reads.
      device: "CPU" or "GPU" (default: a visible GPU, else the CPU). It picks
        the convolution workspaces (TensorFlow's CPU col_buffer, none where
        TF runs oneDNN (TF_ENABLE_ONEDNN_OPTS); cuDNN's;
        tfbigconv's plan for that device) and the default budget. The GPU
        numbers are estimates that have never been checked against a
        measured peak: cuDNN's workspace is taken as one image's patch
        matrix capped at 4 GiB (cuDNN picks its own algorithm and
        workspace), tfbigconv's GPU fft workspace is its smallest plan (the
        kernel may take more within its budget), and TensorFlow's GPU
        allocator's rounding and pooling are not modelled. Only the CPU
        simulation is validated (benchmarks/RESULTS.md).
      budget: bytes for the advice's largest batch (default: the device's
        free memory).
      input_shape: shape of one example without the batch (a list of shapes
        for several inputs); needed when a Keras model has no `inputs`.
      advice: False skips the advice (faster).
      fetches: a tf.Graph's fetches (tensors, operations or their names).
      scope_depth: a graph's layers are its ops' name scopes cut to this many
        components (default: the whole scope).

    Returns a MemoryReport; print it for the table. Raises ValueError for bad
    arguments.
    """
    graph = isinstance(model, tf.Graph) or hasattr(model, "get_concrete_function") or \
        (hasattr(model, "graph") and hasattr(model, "structured_input_signature"))
    if not graph and keras_of(model) is None:
        raise ValueError("memory_report: model must be a Keras model (Keras 3 or tf_keras), a "
                         "tf.function, a ConcreteFunction or a tf.Graph, got "
                         f"{type(model).__name__}")
    if batch_size is not None and (isinstance(batch_size, bool) or
                                   not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"memory_report: batch_size must be a positive int, got {batch_size!r}")
    if device is None:
        device = "GPU" if host.current().has_gpu() else "CPU"
    device = str(device).upper()
    if device not in host.DEVICES:
        raise ValueError(f"memory_report: device must be 'CPU' or 'GPU', got {device!r}")
    if budget is not None and (not isinstance(budget, int) or budget <= 0):
        raise ValueError("memory_report: budget must be a positive number of bytes, "
                         f"got {budget!r}")
    if scope_depth is not None and (not isinstance(scope_depth, int) or scope_depth < 1):
        raise ValueError(f"memory_report: scope_depth must be a positive int, got {scope_depth!r}")
    if graph:
        return _graph_report(model, batch_size, training, optimizer, device, budget,
                             input_shape, advice, fetches, scope_depth)
    for name, value in (("fetches", fetches), ("scope_depth", scope_depth)):
        if value is not None:
            raise ValueError(f"memory_report: {name} is for a tf.Graph or tf.function, "
                             "not a Keras model")
    if batch_size is None:
        raise ValueError("memory_report: batch_size must be a positive int, got None")
    if not model.built:
        raise ValueError("memory_report: the model is not built; call it once or give it an Input")
    if optimizer is None and training:
        optimizer = getattr(model, "optimizer", None)
    trace = Trace(model, input_shape, training)
    return MemoryReport(trace, batch_size, device, training, optimizer, budget, advice, model,
                        input_shape)


def _graph_report(model, batch_size, training, optimizer, device, budget, input_shape, advice,
                  fetches, scope_depth):
    for name, value, default in (("training", training, True), ("optimizer", optimizer, None),
                                 ("input_shape", input_shape, None)):
        if value is not default:
            raise ValueError(f"memory_report: {name} is for a Keras model; a graph's step is "
                             "its ops (its input shapes, its slots: its own)")
    if isinstance(model, tf.Graph):
        trace = GraphTrace.from_graph(model, fetches, scope_depth)
    else:
        if fetches is not None:
            raise ValueError("memory_report: fetches is for a tf.Graph; a function's are its "
                             "outputs")
        trace = GraphTrace.from_function(model, scope_depth)
    if trace.has_batch and batch_size is None:
        raise ValueError("memory_report: batch_size must be a positive int: the graph's inputs "
                         "have an unknown (None) batch dimension")
    if not trace.has_batch:
        known = [trace.tensors[n].dims for n in trace.input_names]
        batch_size = batch_size or (known[0][0] if known and known[0] else 1)
    trace.size_unknown_dims(batch_size)
    return MemoryReport(trace, batch_size, device, trace.training, None, budget, advice)
