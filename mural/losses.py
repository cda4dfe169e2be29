"""Contrastive losses of ALIGN and MURAL, as pure functions (tasks combine them: mural/systems/).

Every loss is an in-batch softmax over the batch it is given; under `jax.jit`
with globally sharded arrays that batch is the global batch, so every example
on every device is a negative for every other (MURAL section 3.1).

All maths runs in float32 whatever the towers computed in: at the t2t
temperature of 0.01 logits reach +-100, which bfloat16 cannot resolve.
"""

from typing import Optional

import jax
import jax.numpy as jnp

# Logit given to padding columns: finite (no NaN in the gradient) yet far below
# anything exp() can see next to a real logit.
_MASKED_LOGIT = -1e9


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps))


def _softmax_xent_diagonal(logits: jax.Array, valid: jax.Array) -> jax.Array:
  """Mean over valid rows of -log softmax(row)[row index], padding columns masked."""
  logits = jnp.where(valid[None, :], logits, _MASKED_LOGIT)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  per_row = -jnp.diagonal(log_probs)
  count = jnp.maximum(jnp.sum(valid), 1)
  return jnp.sum(jnp.where(valid, per_row, 0.0)) / count


def _valid_mask(batch_size: int, mask: Optional[jax.Array]) -> jax.Array:
  if mask is None:
    return jnp.ones((batch_size,), bool)
  return mask.astype(bool)


def contrastive_loss(x: jax.Array, y: jax.Array, temperature: jax.Array,
                     mask: Optional[jax.Array] = None):
  """ALIGN's in-batch softmax, both directions: `L_x2y + L_y2x`.

  Args:
    x, y: [B, D] embeddings of paired items (row i of x matches row i of y);
      cosine similarity, so they are L2-normalised here.
    temperature: scalar dividing the cosines (learned in ALIGN/MURAL).
    mask: optional bool [B]; False rows are padding, excluded from the loss
      and from every row's negatives.
  Returns:
    (loss, {'x2y': ..., 'y2x': ...}) as float32 scalars.
  """
  valid = _valid_mask(x.shape[0], mask)
  sim = l2_normalize(x) @ l2_normalize(y).T
  logits = sim / jnp.asarray(temperature, jnp.float32)
  x2y = _softmax_xent_diagonal(logits, valid)
  y2x = _softmax_xent_diagonal(logits.T, valid)
  return x2y + y2x, {"x2y": x2y, "y2x": y2x}


def additive_margin_loss(left: jax.Array, right: jax.Array, temperature: float = 0.01,
                         margin: float = 0.3, mask: Optional[jax.Array] = None):
  """Bidirectional additive-margin softmax for translation pairs (Yang et al. 2019).

  The margin is subtracted from the positive pair's cosine only, before the
  temperature scaling: `logits_ij = (cos_ij - margin * [i == j]) / T`.
  Returns (L_l2r + L_r2l, {'l2r': ..., 'r2l': ...}).
  """
  valid = _valid_mask(left.shape[0], mask)
  sim = l2_normalize(left) @ l2_normalize(right).T
  sim = sim - margin * jnp.eye(sim.shape[0], dtype=sim.dtype)
  logits = sim / temperature
  l2r = _softmax_xent_diagonal(logits, valid)
  r2l = _softmax_xent_diagonal(logits.T, valid)
  return l2r + r2l, {"l2r": l2r, "r2l": r2l}


# ---- Triplet losses of EmbN (Wang et al. 2019), MULE and SMALR -----------------------


def cosine_distance(x: jax.Array, y: jax.Array) -> jax.Array:
  """[N, D], [M, D] -> [N, M] of 1 - cos(x_i, y_j)."""
  return 1.0 - l2_normalize(x) @ l2_normalize(y).T


def _top_k_hinge(dist: jax.Array, margin: float, k: int, valid: jax.Array) -> jax.Array:
  """Rows are anchors, dist[i, i] the positive: mean over valid anchors of the mean of their
  k largest hinges max(0, m + d_ii - d_ij), j != i valid (missing negatives count as 0)."""
  n = dist.shape[0]
  k = min(k, max(n - 1, 1))
  hinge = jnp.maximum(0.0, margin + jnp.diagonal(dist)[:, None] - dist)
  negative = valid[None, :] & ~jnp.eye(n, dtype=bool)
  hinge = jnp.where(negative, hinge, 0.0)
  per_anchor = jnp.mean(jax.lax.top_k(hinge, k)[0], axis=-1)
  return jnp.sum(jnp.where(valid, per_anchor, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def top_k_triplet_loss(x: jax.Array, y: jax.Array, margin: float, k: int = 10,
                       mask: Optional[jax.Array] = None):
  """Bidirectional margin triplet loss over the K most violated constraints per anchor.

  Row i of x and row i of y are a positive pair (an image and its sentence, or
  two sentences of one image); every other valid row of the other side is a
  negative. Cosine distance d = 1 - cos. For each anchor x_i the hinges
  max(0, m + d(x_i, y_i) - d(x_i, y_j)) over negatives j, the K largest of
  them averaged (EmbN's `top_k` over violations, K = 10 in MULE and SMALR);
  the same with y as anchors. This is MULE's Eq. 3 (image-sentence) and each
  term of its Eq. 1 (neighbourhood constraints).
  Returns (L_x2y + L_y2x, {'x2y': ..., 'y2x': ...}).
  """
  valid = _valid_mask(x.shape[0], mask)
  dist = cosine_distance(x, y)
  x2y = _top_k_hinge(dist, margin, k, valid)
  y2x = _top_k_hinge(dist.T, margin, k, valid)
  return x2y + y2x, {"x2y": x2y, "y2x": y2x}


def mean_negative_cosine(x: jax.Array, y: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
  """The mean cos(x_i, y_j) over valid i != j: how alike the non-matching pairs are. Near 1 when a
  ranking loss has collapsed every row onto one point (the loss then sits at its margin)."""
  valid = _valid_mask(x.shape[0], mask)
  pairs = valid[:, None] & valid[None, :] & ~jnp.eye(x.shape[0], dtype=bool)
  cos = 1.0 - cosine_distance(x.astype(jnp.float32), y.astype(jnp.float32))
  return jnp.sum(jnp.where(pairs, cos, 0.0)) / jnp.maximum(jnp.sum(pairs), 1)


# ---- SMALR (Burns et al. 2020) -----------------------------------------------------


def _safe_norm(x: jax.Array) -> jax.Array:
  """Euclidean norm over the last axis with gradient 0 (not NaN) at the zero vector."""
  sq = jnp.sum(x * x, axis=-1)
  positive = sq > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def masked_reconstruction_loss(masked: jax.Array, predicted: jax.Array, full: jax.Array,
                               mask: Optional[jax.Array] = None):
  """One sentence's term of SMALR's L_mask (Eq. 2): ||l2(S^m + S') - l2(S)||, mean over valid rows.

  masked: S^m [B, D], the masked sentence's representation; predicted: S' [B, D], what the
  shared FC predicts is missing from it; full: S [B, D], the unmasked sentence. The norm
  is the plain (not squared) Euclidean one, as the paper writes it. L_mask of a pair
  (i, j) is this for i plus this for j. Returns the float32 scalar.
  """
  valid = _valid_mask(masked.shape[0], mask)
  rebuilt = l2_normalize(masked.astype(jnp.float32) + predicted.astype(jnp.float32))
  per_row = _safe_norm(rebuilt - l2_normalize(full))
  return jnp.sum(jnp.where(valid, per_row, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def score_triplet_loss(scores: jax.Array, text_to_image: jax.Array, margin: float, k: int = 10,
                       sentence_weight: float = 1.5, mask: Optional[jax.Array] = None):
  """SMALR's L_mm (Eq. 3) on a [M texts, N images] matrix of scores (higher = closer).

  Distances are -scores (for cosines, d = 1 - cos up to the constant). Each valid
  text m and its image t(m) are a positive pair. Sentence anchors: the hinges
  max(0, m + S[m, j] - S[m, t(m)]) over images j != t(m); image anchors (one per
  pair): max(0, m + S[n, t(m)] - S[m, t(m)]) over valid texts n of other images.
  Each anchor averages its K largest hinges (missing ones count 0), anchors are
  averaged, and L = image-anchor term + sentence_weight * sentence-anchor term
  (lambda_1 = 1.5). With one text per image in image order this is
  top_k_triplet_loss's two terms on distances -S. CLC-C trains on it.
  Returns (loss, {'i2s': image-anchor term, 's2i': sentence-anchor term}).
  """
  scores = scores.astype(jnp.float32)
  m, n = scores.shape
  valid = _valid_mask(m, mask)
  t = text_to_image.astype(jnp.int32)
  positive = jnp.take_along_axis(scores, t[:, None], axis=1)  # [M, 1]
  other_image = jnp.arange(n)[None, :] != t[:, None]
  s2i_hinge = jnp.where(other_image, jnp.maximum(0.0, margin + scores - positive), 0.0)
  column = scores[:, t].T  # [M pairs, M texts]: text n's score with pair m's image.
  other_text = (t[None, :] != t[:, None]) & valid[None, :]
  i2s_hinge = jnp.where(other_text, jnp.maximum(0.0, margin + column - positive), 0.0)

  def term(hinge, count):
    kk = min(k, max(count, 1))
    per_anchor = jnp.mean(jax.lax.top_k(hinge, kk)[0], axis=-1)
    return jnp.sum(jnp.where(valid, per_anchor, 0.0)) / jnp.maximum(jnp.sum(valid), 1)

  s2i = term(s2i_hinge, n - 1)
  i2s = term(i2s_hinge, m - 1)
  return i2s + sentence_weight * s2i, {"i2s": i2s, "s2i": s2i}


def language_classifier_loss(logits: jax.Array, labels: jax.Array, mask: Optional[jax.Array] = None):
  """Cross-entropy of a language classifier (MULE's Eq. 2), mean over valid rows.

  The adversarial sign is not here: the model puts a gradient-reversal layer
  between the features and the classifier (mural/models/multilingual.py).
  Returns (loss, {'accuracy': share of valid rows classified right}).
  """
  valid = _valid_mask(logits.shape[0], mask)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  per_row = -jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
  count = jnp.maximum(jnp.sum(valid), 1)
  loss = jnp.sum(jnp.where(valid, per_row, 0.0)) / count
  right = jnp.argmax(logits, axis=-1) == labels
  return loss, {"accuracy": jnp.sum(jnp.where(valid, right, False)) / count}


# ---- Globetrotter (Surís et al. 2022) --------------------------------------------------
# Every similarity is a cosine rescaled from [-1, 1] to [0, 1] (paper B.1): s = (cos + 1) / 2,
# then divided by a temperature. A softmax does not see the shift, so a softmax over rescaled
# similarities at temperature t is the one over cosines at 2t; the targets alpha of L_t do see it.


def rescaled_similarity(x: jax.Array, y: jax.Array) -> jax.Array:
  """[N, D], [M, D] -> [N, M] of (cos(x_i, y_j) + 1) / 2, in [0, 1]."""
  return (l2_normalize(x) @ l2_normalize(y).T + 1.0) / 2.0


def nt_xent_loss(z1: jax.Array, z2: jax.Array, temperature: float, mask: Optional[jax.Array] = None):
  """SimCLR's NT-Xent (Globetrotter's L_v, Eq. 3) between two views of each of N images.

  The 2N embeddings are the anchors; each one's positive is the other view of
  its image, its negatives the other 2(N - 1) embeddings (itself excluded from
  the denominator). Mean over the 2N valid anchors of
  -log exp(s_ij / t) / sum_{k != i} exp(s_ik / t), s rescaled to [0, 1].
  Returns (loss, {'accuracy': share of anchors whose top match is their other view}).
  """
  n = z1.shape[0]
  valid = jnp.tile(_valid_mask(n, mask), 2)
  z = jnp.concatenate([z1, z2], axis=0)
  logits = rescaled_similarity(z, z) / temperature
  keep = valid[None, :] & ~jnp.eye(2 * n, dtype=bool)
  logits = jnp.where(keep, logits, _MASKED_LOGIT)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  partner = jnp.concatenate([jnp.arange(n, 2 * n), jnp.arange(n)])
  per_row = -jnp.take_along_axis(log_probs, partner[:, None], axis=-1)[:, 0]
  count = jnp.maximum(jnp.sum(valid), 1)
  right = jnp.argmax(logits, axis=-1) == partner
  return (jnp.sum(jnp.where(valid, per_row, 0.0)) / count,
          {"accuracy": jnp.sum(jnp.where(valid, right, False)) / count})


def image_caption_loss(image: jax.Array, text: jax.Array, temperature: float,
                       mask: Optional[jax.Array] = None):
  """Globetrotter's L_x (Eq. 4): the in-batch softmax both ways over rescaled similarities at
  `temperature`, which is `contrastive_loss` (cosines) at 2 * temperature.
  Returns (L_i2t + L_t2i, {'x2y': ..., 'y2x': ...})."""
  return contrastive_loss(image, text, 2.0 * temperature, mask)


def masked_lm_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array):
  """Token cloze (BERT's masked LM, Globetrotter's L_c): cross-entropy of the [B, L, V] logits
  at the positions where weights [B, L] is nonzero, weighted mean over those positions only.
  Returns (loss, {'accuracy': weighted share of masked tokens predicted right})."""
  weights = weights.astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  total = jnp.maximum(jnp.sum(weights), 1e-9)
  right = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return jnp.sum(nll * weights) / total, {"accuracy": jnp.sum(right * weights) / total}


def transitive_targets(image: jax.Array, text: jax.Array, margin: float = 0.4) -> jax.Array:
  """Globetrotter's Eq. 2: alpha_ij = f(a^x_ii * a^v_ij * a^x_jj), f(x) = max(0, x - m) / (1 - m).

  a^x_ii: rescaled similarity of image i and its caption i; a^v_ij: of images
  i and j. Symmetric, in [0, 1]; a stop-gradient (targets, not a path for
  L_t to move the image side or the image-caption alignment).
  """
  a_x = jnp.diagonal(rescaled_similarity(image, text))
  a_v = rescaled_similarity(image, image)
  alpha = jnp.maximum(0.0, a_x[:, None] * a_v * a_x[None, :] - margin) / (1.0 - margin)
  return jax.lax.stop_gradient(alpha)


def transitive_text_loss(text: jax.Array, image: jax.Array, temperature: float, margin: float = 0.4,
                         mask: Optional[jax.Array] = None):
  """Globetrotter's L_t (Eq. 1) with the transitive targets of Eq. 2.

  -sum_{j != i} alpha_ij log exp(b_ij / t) / sum_{k != i} exp(b_ik / t), with
  b the rescaled similarity between captions i and j and alpha
  `transitive_targets(image, text, margin)` (not normalised per row: a
  caption with no image-confirmed partner pulls on nothing, as in the paper);
  mean over valid anchors i; padding rows are neither anchors nor candidates.
  Returns (loss, {'positive_mass': mean over anchors of sum_j alpha_ij}).
  """
  n = text.shape[0]
  valid = _valid_mask(n, mask)
  keep = valid[:, None] & valid[None, :] & ~jnp.eye(n, dtype=bool)
  alpha = jnp.where(keep, transitive_targets(image, text, margin), 0.0)
  logits = jnp.where(keep, rescaled_similarity(text, text) / temperature, _MASKED_LOGIT)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  per_row = -jnp.sum(alpha * jnp.where(keep, log_probs, 0.0), axis=-1)
  count = jnp.maximum(jnp.sum(valid), 1)
  return (jnp.sum(jnp.where(valid, per_row, 0.0)) / count,
          {"positive_mass": jnp.sum(jnp.where(valid, jnp.sum(alpha, -1), 0.0)) / count})


def max_hinge_loss(x: jax.Array, y: jax.Array, margin: float, mask: Optional[jax.Array] = None):
  """VSE++'s max of hinges (Faghri et al. 2017; Kádár et al. 2018): the hardest negative only.

  Row i of x and row i of y are a positive pair; s = cosine similarity. For
  each anchor x_i the largest hinge max(0, margin - s(x_i, y_i) + s(x_i, y_j))
  over the valid negatives j != i, and the same with y as anchors; each
  direction averaged over the valid anchors (VSE++'s code sums over the batch:
  the same up to the constant batch size, which Adam's normalisation removes).
  A batch with no valid negative gives 0. Returns (L_x2y + L_y2x, {'x2y', 'y2x'}).
  """
  valid = _valid_mask(x.shape[0], mask)
  sim = l2_normalize(x) @ l2_normalize(y).T
  n = sim.shape[0]
  negative = valid[None, :] & ~jnp.eye(n, dtype=bool)
  count = jnp.maximum(jnp.sum(valid), 1)

  def one_way(s):
    hinge = jnp.where(negative, jnp.maximum(0.0, margin - jnp.diagonal(s)[:, None] + s), 0.0)
    return jnp.sum(jnp.where(valid, jnp.max(hinge, axis=-1), 0.0)) / count

  x2y, y2x = one_way(sim), one_way(sim.T)
  return x2y + y2x, {"x2y": x2y, "y2x": y2x}
