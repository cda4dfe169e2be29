"""Image ops (TensorFlow, run inside tf.data): decode, crop, flip, normalise.

Pixel convention: every image the model sees is float32 in [-1, 1]
(`x / 127.5 - 1`), the value range big_vision uses for ALIGN-style
EfficientNet towers trained from scratch; no per-channel mean/std, so the same
transform works for any data and is trivially inverted for inspection.

Training: Inception-style random resized crop (area fraction and aspect ratio
sampled from config ranges, ALIGN-ish default area (0.5, 1)) resized to
`image_size`, then a random horizontal flip. Evaluation: resize the short side
to `eval_resize`, then the central `image_size` square (ALIGN: 346 -> 289).
All randomness is stateless and keyed by a per-example seed, so the output is a
pure function of (record, seed): that is what makes the pipeline reproducible
and its resume exact.
"""

import tensorflow as tf

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_encoded_image(data: tf.Tensor) -> tf.Tensor:
  """Whether `data` (scalar tf.string) starts like a JPEG or PNG file."""
  return tf.logical_or(
      tf.equal(tf.strings.substr(data, 0, len(_JPEG_MAGIC)), _JPEG_MAGIC),
      tf.equal(tf.strings.substr(data, 0, len(_PNG_MAGIC)), _PNG_MAGIC))


def decode(data: tf.Tensor) -> tf.Tensor:
  """JPEG/PNG bytes -> uint8 [H, W, 3] (grey and alpha images become RGB).

  Raises (inside tf.data) on undecodable bytes; the pipeline runs it under a
  per-record guard that turns the error into a counted skip.
  """
  image = tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)
  image.set_shape([None, None, 3])
  return image


def normalize(image: tf.Tensor) -> tf.Tensor:
  """Pixels in [0, 255] (any dtype) -> float32 in [-1, 1]."""
  return tf.cast(image, tf.float32) / 127.5 - 1.0


def _resize(image: tf.Tensor, height, width) -> tf.Tensor:
  # Antialiasing matters here: photos are often shrunk 5-10x to the crop size.
  return tf.image.resize(image, tf.stack([height, width]), method="bilinear", antialias=True)


def random_resized_crop(image: tf.Tensor, seed: tf.Tensor, size: int,
                        area_range=(0.5, 1.0), aspect_range=(3 / 4, 4 / 3)) -> tf.Tensor:
  """A random box (area fraction, aspect ratio in the ranges) resized to size^2.

  Returns float32 in [0, 255]. `seed` is a stateless seed, int64 [2].
  """
  begin, box, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.zeros([1, 0, 4], tf.float32), seed=seed,
      min_object_covered=0.0, aspect_ratio_range=tuple(aspect_range),
      area_range=tuple(area_range), max_attempts=10, use_image_if_no_bounding_boxes=True)
  crop = tf.slice(image, begin, box)
  out = _resize(crop, size, size)
  out.set_shape([size, size, 3])
  return out


def train_image(image: tf.Tensor, seed: tf.Tensor, size: int, area_range=(0.5, 1.0),
                aspect_range=(3 / 4, 4 / 3), flip: bool = True) -> tf.Tensor:
  """uint8 [H, W, 3] -> float32 [size, size, 3] in [-1, 1], randomly cropped/flipped."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  out = random_resized_crop(image, crop_seed, size, area_range, aspect_range)
  if flip:
    out = tf.image.stateless_random_flip_left_right(out, flip_seed)
  return normalize(out)


def eval_image(image: tf.Tensor, resize: int, size: int) -> tf.Tensor:
  """uint8 [H, W, 3] -> float32 [size, size, 3] in [-1, 1]: short side to `resize`, central crop.

  Deterministic; `resize >= size` (validate() checks data.eval_resize).
  """
  return normalize(eval_crop(image, resize, size))


def eval_crop(image: tf.Tensor, resize: int, size: int) -> tf.Tensor:
  """eval_image before its normalisation: float32 [size, size, 3] in [0, 255]."""
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
  short = tf.minimum(h, w)
  # The short side is exactly `resize`; the long side is rounded, never below it.
  new_h = tf.maximum(tf.cast(tf.round(h * resize / short), tf.int32), resize)
  new_w = tf.maximum(tf.cast(tf.round(w * resize / short), tf.int32), resize)
  resized = _resize(image, new_h, new_w)
  top, left = (new_h - size) // 2, (new_w - size) // 2
  out = resized[top:top + size, left:left + size]
  out.set_shape([size, size, 3])
  return out


# ---- SimCLR views (Chen et al. 2020; Globetrotter's two augmentations per image) -----------


def gaussian_blur(image: tf.Tensor, sigma: tf.Tensor, radius: int) -> tf.Tensor:
  """Separable Gaussian blur of a float [H, W, C] image, kernel 2 * radius + 1, reflect-padded."""
  x = tf.cast(tf.range(-radius, radius + 1), tf.float32)
  k = tf.exp(-0.5 * tf.square(x / tf.maximum(sigma, 1e-3)))
  k = k / tf.reduce_sum(k)
  channels = tf.shape(image)[-1]
  padded = tf.pad(image[None], [[0, 0], [radius, radius], [radius, radius], [0, 0]], mode="REFLECT")
  horizontal = tf.tile(tf.reshape(k, [1, -1, 1, 1]), [1, 1, channels, 1])
  vertical = tf.tile(tf.reshape(k, [-1, 1, 1, 1]), [1, 1, channels, 1])
  out = tf.nn.depthwise_conv2d(padded, horizontal, [1, 1, 1, 1], "VALID")
  out = tf.nn.depthwise_conv2d(out, vertical, [1, 1, 1, 1], "VALID")
  return out[0]


def simclr_view(image: tf.Tensor, seed: tf.Tensor, size: int, area_range=(0.08, 1.0),
                aspect_range=(3 / 4, 4 / 3), flip: bool = True, colour_strength: float = 1.0,
                colour_prob: float = 0.8, grayscale_prob: float = 0.2, blur_prob: float = 0.5) -> tf.Tensor:
  """uint8 [H, W, 3] -> float32 [size, size, 3] in [-1, 1]: SimCLR's augmentation.

  Random resized crop (+ flip), colour distortion with probability
  colour_prob (brightness, contrast, saturation 0.8 s, hue 0.2 s, s =
  colour_strength), grayscale with probability grayscale_prob, Gaussian
  blur with probability blur_prob (sigma in [0.1, 2.0] at 224 px, scaled to
  `size`; kernel 10% of the side). Stateless: a pure function of (image, seed).
  """
  seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 10))
  x = random_resized_crop(image, seeds[0], size, area_range, aspect_range) / 255.0
  if flip:
    x = tf.image.stateless_random_flip_left_right(x, seeds[1])
  s = colour_strength

  def jitter(x):
    x = tf.image.stateless_random_brightness(x, 0.8 * s, seeds[2])
    x = tf.image.stateless_random_contrast(x, max(0.0, 1 - 0.8 * s), 1 + 0.8 * s, seeds[3])
    x = tf.image.stateless_random_saturation(x, max(0.0, 1 - 0.8 * s), 1 + 0.8 * s, seeds[4])
    if 0.2 * s > 0:
      x = tf.image.stateless_random_hue(x, min(0.5, 0.2 * s), seeds[5])
    return tf.clip_by_value(x, 0.0, 1.0)

  coin = lambda i: tf.random.stateless_uniform([], seeds[i])
  if s > 0:
    x = tf.cond(coin(6) < colour_prob, lambda: jitter(x), lambda: x)
  x = tf.cond(coin(7) < grayscale_prob, lambda: tf.tile(tf.image.rgb_to_grayscale(x), [1, 1, 3]), lambda: x)
  radius = max(1, size // 20)
  sigma = tf.random.stateless_uniform([], seeds[8], 0.1, 2.0) * size / 224.0
  x = tf.cond(coin(9) < blur_prob, lambda: gaussian_blur(x, sigma, radius), lambda: x)
  x.set_shape([size, size, 3])
  return normalize(x * 255.0)
