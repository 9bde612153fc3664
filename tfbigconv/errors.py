"""TensorFlow's exception classes, made the one way every layer raises them."""
import tensorflow as tf


def invalid_argument(message):
    return tf.errors.InvalidArgumentError(None, None, message)


def resource_exhausted(message):
    return tf.errors.ResourceExhaustedError(None, None, message)


def unimplemented(message):
    return tf.errors.UnimplementedError(None, None, message)
