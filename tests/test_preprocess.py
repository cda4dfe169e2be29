"""Image ops against hand-computed values: decode, normalise, eval resize + crop, train crop + flip."""

import types

import numpy as np
import pytest
import tensorflow as tf

from mural.data import preprocess


def _jpeg(pixels):
  return tf.io.encode_jpeg(tf.constant(pixels, tf.uint8), quality=100).numpy()


def _png(pixels):
  return tf.io.encode_png(tf.constant(pixels, tf.uint8)).numpy()


def test_is_encoded_image():
  rgb = np.zeros((4, 5, 3), np.uint8)
  assert bool(preprocess.is_encoded_image(tf.constant(_jpeg(rgb))))
  assert bool(preprocess.is_encoded_image(tf.constant(_png(rgb))))
  for data in (b"", b"<html><body>404</body></html>", b"\xff\xd8", b"GIF89a...."):
    assert not bool(preprocess.is_encoded_image(tf.constant(data))), data


def test_decode_makes_rgb_uint8():
  grey = np.arange(12, dtype=np.uint8).reshape(3, 4, 1) * 20
  out = preprocess.decode(tf.constant(_png(grey))).numpy()
  assert out.shape == (3, 4, 3) and out.dtype == np.uint8
  np.testing.assert_array_equal(out, np.repeat(grey, 3, axis=-1))
  rgba = np.concatenate([np.full((2, 2, 3), 7, np.uint8), np.full((2, 2, 1), 99, np.uint8)], -1)
  np.testing.assert_array_equal(preprocess.decode(tf.constant(_png(rgba))).numpy(), np.full((2, 2, 3), 7))
  colour = np.tile(np.array([200, 30, 90], np.uint8), (16, 16, 1))
  out = preprocess.decode(tf.constant(_jpeg(colour))).numpy()
  assert out.shape == (16, 16, 3)
  np.testing.assert_allclose(out, colour, atol=3)  # JPEG is lossy.


def test_normalize_range():
  out = preprocess.normalize(tf.constant([0, 255, 51], tf.uint8)).numpy()
  np.testing.assert_allclose(out, [-1.0, 1.0, 51 / 127.5 - 1], rtol=0, atol=1e-6)
  assert out.dtype == np.float32


def test_eval_image_resize_and_central_crop_values():
  # A horizontal ramp x -> x on a 100 x 200 image: the short side 100 -> 50 halves
  # it, so column j of the resize holds the mean of columns 2j, 2j+1 = 2j + 0.5
  # (exact for a linear ramp away from the borders); the central 40 columns start
  # at (100 - 40) / 2 = 30.
  ramp = np.tile(np.arange(200, dtype=np.float64)[None, :, None], (100, 1, 3))
  out = preprocess.eval_image(tf.constant(ramp.astype(np.uint8)), resize=50, size=40).numpy()
  assert out.shape == (40, 40, 3) and out.dtype == np.float32
  expected = (2 * (30 + np.arange(40)) + 0.5) / 127.5 - 1
  np.testing.assert_allclose(out[20, :, 0], expected, atol=1e-4)
  np.testing.assert_allclose(out, np.broadcast_to(expected[None, :, None], out.shape), atol=1e-4)


@pytest.mark.parametrize("shape", [(30, 90, 3), (90, 30, 3), (33, 33, 3), (7, 11, 3)])
def test_eval_image_shape_and_determinism(shape):
  image = tf.constant(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
  a = preprocess.eval_image(image, resize=24, size=20).numpy()
  b = preprocess.eval_image(image, resize=24, size=20).numpy()
  assert a.shape == (20, 20, 3)
  np.testing.assert_array_equal(a, b)
  assert a.min() >= -1.0 and a.max() <= 1.0


def test_eval_images_of_any_sizes_are_eval_image_bit_for_bit():
  """eval_data.eval_images (one graph for the crops, one normalisation for all) gives each
  image exactly what eval_image gives it alone, eagerly."""
  from mural.data import eval_data  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in [(30, 90, 3), (90, 30, 3),
                                                                       (33, 33, 3), (7, 11, 3), (64, 64, 3)]]
  data_config = types.SimpleNamespace(eval_resize=24, image_size=20)
  got = eval_data.eval_images(images, data_config)
  want = np.stack([preprocess.eval_image(tf.constant(im), resize=24, size=20).numpy() for im in images])
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="no evaluation images"):
    eval_data.eval_images([], data_config)


def test_train_image_full_area_crop_is_a_resize_and_flip_mirrors():
  rng = np.random.default_rng(1)
  image = tf.constant(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8))
  whole = preprocess.normalize(tf.image.resize(image, [12, 12], antialias=True)).numpy()
  flips = 0
  for s in range(20):
    seed = tf.constant([s, 7], tf.int64)
    out = preprocess.train_image(image, seed, 12, area_range=(1.0, 1.0), aspect_range=(1.0, 1.0)).numpy()
    if np.allclose(out, whole, atol=1e-5):
      continue
    np.testing.assert_allclose(out, whole[:, ::-1], atol=1e-5)  # The only other outcome.
    flips += 1
  assert 3 <= flips <= 17  # A fair coin over 20 seeds.
  no_flip = [preprocess.train_image(image, tf.constant([s, 7], tf.int64), 12, (1.0, 1.0), (1.0, 1.0),
                                    flip=False).numpy() for s in range(5)]
  for out in no_flip:
    np.testing.assert_allclose(out, whole, atol=1e-5)


def test_train_image_seeded_and_in_range():
  image = tf.constant(np.random.default_rng(2).integers(0, 256, (40, 60, 3), dtype=np.uint8))
  seed = tf.constant([3, 4], tf.int64)
  a = preprocess.train_image(image, seed, 16).numpy()
  b = preprocess.train_image(image, seed, 16).numpy()
  c = preprocess.train_image(image, tf.constant([3, 5], tf.int64), 16).numpy()
  assert a.shape == (16, 16, 3) and a.dtype == np.float32
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  assert a.min() >= -1.0 and a.max() <= 1.0


def test_random_resized_crop_area_within_range():
  # Channel 0 holds each pixel's row, channel 1 its column: the resized crop's
  # values must stay inside the box the sampler picks for the same seed.
  h, w = 64, 64
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  image = tf.constant(np.stack([rows, cols, rows], -1).astype(np.float32))
  for s in range(20):
    begin, box, _ = tf.image.stateless_sample_distorted_bounding_box(
        [h, w, 3], tf.zeros([1, 0, 4]), seed=[s, 0], min_object_covered=0.0,
        aspect_ratio_range=(0.75, 4 / 3), area_range=(0.5, 1.0), use_image_if_no_bounding_boxes=True)
    # The op our crop calls must honour the area range we configure.
    area = float(box[0] * box[1]) / (h * w)
    assert 0.5 - 0.05 <= area <= 1.0, area
    out = preprocess.random_resized_crop(image, tf.constant([s, 0], tf.int64), 8).numpy()
    assert out.shape == (8, 8, 3)
    for c in (0, 1):
      lo, size = float(begin[c]), float(box[c])
      assert out[..., c].min() >= lo - 1e-3 and out[..., c].max() <= lo + size - 1 + 1e-3
      assert out[..., c].max() - out[..., c].min() >= size / 2  # It is the box, not a corner of it.
