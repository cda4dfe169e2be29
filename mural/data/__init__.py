"""mural's input side: sources, record kinds, the tf.data pipeline, vocabulary, eval sets."""


def hide_accelerators_from_tensorflow():
  """TensorFlow only runs the input pipeline: keep it off the GPUs/TPUs JAX uses.

  Without this, TF initialises CUDA and takes GPU memory beside JAX (big_vision
  does the same first thing). Every entry point calls it before TF makes its
  devices (mural.main, mural.data.convert).
  """
  import logging  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for kind in ("GPU", "TPU"):
    try:
      tf.config.set_visible_devices([], kind)
    except (ValueError, RuntimeError) as e:  # A kind this build lacks; devices already made.
      logging.warning("Could not hide %s devices from TensorFlow: %s", kind, e)
