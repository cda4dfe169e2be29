"""SMALR's Cross-Lingual Consistency at test time (Burns et al. 2020, section 3.4).

Each text query is also issued in the other languages, and the image scores
of its versions are combined: CLC-A averages them; CLC-C feeds the |L|
scores of each (query, image) to a tiny MLP (|L| inputs, 32 hidden units,
ReLU, one output; no biases: |L| * 32 + 32 = 352 parameters at |L| = 10,
the paper's count) trained on a validation split for 30 full-batch
iterations with the multimodal triplet loss (losses.score_triplet_loss,
margin 0.05, K = 10, 1.5 on the sentence->image side).

The paper translates each query by machine; on our data the caption of the
same image in the other language stands in (the built-in captions of one
scene are translations of each other): version l' of caption m of image k in
language l is caption j of image k in l', j = m's position among k's
captions in l (modulo l's count; a language without a caption of k gives
the query's own score, so it neither helps nor hurts).

Where the paper is silent: "initialized with uniform weight" is read as
weights drawn uniformly from [0, 2/|L|] (first layer) and [0, 2/32] (second),
whose means make the untrained MLP the average of CLC-A, symmetry broken;
Adam at learning rate 1e-2; the validation split is the first
`validation_images` images of the eval set (and their captions), and the
single-language query, CLC-A and CLC-C are all reported on the remaining
images, so the three numbers compare on the same queries.

Scores are whole [queries, images] matrices per language (not the blockwise
metrics: an aggregate of scores is no dot product), fine for eval sets of a
few thousand images.
"""

from typing import Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mural import losses
from mural import metrics


def translation_index(text_to_image: Sequence[np.ndarray]) -> np.ndarray:
  """int [L, L, M_max]: index[l, l2, m] = the caption of language l2 standing in for caption m of
  language l (its version in l2), or -1 when l2 has no caption of that image. text_to_image:
  per language, each caption's image."""
  num = len(text_to_image)
  longest = max(len(t) for t in text_to_image)
  out = np.full((num, num, longest), -1, np.int64)
  captions_of = []
  for t in text_to_image:
    by_image: Dict[int, List[int]] = {}
    for m, k in enumerate(np.asarray(t)):
      by_image.setdefault(int(k), []).append(m)
    captions_of.append(by_image)
  for l, t in enumerate(text_to_image):
    for m, k in enumerate(np.asarray(t)):
      j = captions_of[l][int(k)].index(m)
      for l2 in range(num):
        theirs = captions_of[l2].get(int(k))
        if theirs:
          out[l, l2, m] = theirs[j % len(theirs)]
  return out


def language_scores(sims: Sequence[np.ndarray], index: np.ndarray, l: int) -> np.ndarray:
  """[M_l, N, L] scores of language l's queries, issued in every language: sims[l2] is language
  l2's [M_l2, N] text-image similarity; a missing version takes the query's own row."""
  m = sims[l].shape[0]
  out = np.empty((m, sims[l].shape[1], len(sims)), np.float64)
  for l2, sim in enumerate(sims):
    rows = index[l, l2, :m]
    own = sims[l]
    out[:, :, l2] = np.where((rows >= 0)[:, None], sim[np.maximum(rows, 0)], own)
  return out


def clc_average(scores: np.ndarray) -> np.ndarray:
  """CLC-A: [..., L] -> [...], the mean over languages."""
  return np.mean(scores, axis=-1)


def mlp_init(rng: jax.Array, num_languages: int, hidden: int = 32) -> dict:
  """CLC-C's parameters (see the module docstring): {'w1': [L, H], 'w2': [H]}."""
  k1, k2 = jax.random.split(rng)
  return {"w1": jax.random.uniform(k1, (num_languages, hidden), jnp.float32, 0.0, 2.0 / num_languages),
          "w2": jax.random.uniform(k2, (hidden,), jnp.float32, 0.0, 2.0 / hidden)}


def mlp_apply(params: dict, scores: jax.Array) -> jax.Array:
  """CLC-C: [..., L] scores -> [...] combined score, relu(s @ w1) @ w2."""
  return jax.nn.relu(scores @ params["w1"]) @ params["w2"]


def train_mlp(params: dict, scores: Sequence[np.ndarray], text_to_image: Sequence[np.ndarray],
              iterations: int = 30, learning_rate: float = 1e-2, margin: float = 0.05, k: int = 10,
              sentence_weight: float = 1.5):
  """CLC-C trained full-batch: each iteration one Adam step on the mean over query languages of
  score_triplet_loss(mlp(scores[l]), text_to_image[l]). Returns (params, [loss before each step])."""
  scores = [jnp.asarray(s, jnp.float32) for s in scores]
  targets = [jnp.asarray(t, jnp.int32) for t in text_to_image]

  def loss_fn(p):
    return sum(losses.score_triplet_loss(mlp_apply(p, s), t, margin, k, sentence_weight)[0]
               for s, t in zip(scores, targets)) / len(scores)

  opt = optax.adam(learning_rate)
  state = opt.init(params)

  @jax.jit
  def step(p, state):
    value, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, value

  history = []
  for _ in range(iterations):
    params, state, value = step(params, state)
    history.append(float(value))
  return params, history


def _split(text_to_image: np.ndarray, first: int):
  t = np.asarray(text_to_image)
  return np.flatnonzero(t < first), np.flatnonzero(t >= first)


class CrossLingualConsistency:
  """Evaluator: per language, on the test images, the single-language query ('<lang>:one'),
  CLC-A ('<lang>:clc-a') and CLC-C ('<lang>:clc-c') recalls, and 'clc/<variant>_mR' means.

  sets: eval_data.EvalSets sharing one image array (every language's captions of the same
  images). The first validation_images images train CLC-C."""

  def __init__(self, sets: Sequence, validation_images: int, hidden: int = 32, iterations: int = 30,
               learning_rate: float = 1e-2, margin: float = 0.05, top_k: int = 10, sentence_weight: float = 1.5,
               seed: int = 0):
    self.sets = list(sets)
    if len({id(s.images) for s in self.sets}) > 1:
      raise ValueError("CrossLingualConsistency needs eval sets sharing one image array")
    self.validation_images, self.hidden, self.iterations = validation_images, hidden, iterations
    self.learning_rate, self.margin, self.top_k = learning_rate, margin, top_k
    self.sentence_weight, self.seed = sentence_weight, seed

  def run(self, embedder, variables) -> Dict[str, float]:
    if len(self.sets) < 2:
      return {}
    images = embedder.images(variables, self.sets[0].images, None)
    sims = [embedder.texts(variables, s.text_ids, s.text_mask, None) @ images.T for s in self.sets]
    return self.score(sims)

  def score(self, sims: Sequence[np.ndarray]) -> Dict[str, float]:
    """The evaluator's figures from each language's [M_l, N] similarity matrix."""
    v = self.validation_images
    index = translation_index([s.text_to_image for s in self.sets])
    per_lang = [language_scores(sims, index, l) for l in range(len(self.sets))]
    val_scores, val_targets, test = [], [], []
    for s, scores in zip(self.sets, per_lang):
      val_rows, test_rows = _split(s.text_to_image, v)
      val_scores.append(scores[val_rows][:, :v])
      val_targets.append(s.text_to_image[val_rows])
      test.append((scores[test_rows][:, v:], s.text_to_image[test_rows] - v))
    params = mlp_init(jax.random.PRNGKey(self.seed), len(self.sets), self.hidden)
    params, _ = train_mlp(params, val_scores, val_targets, self.iterations, self.learning_rate, self.margin,
                          self.top_k, self.sentence_weight)
    out, means = {}, {"one": [], "clc-a": [], "clc-c": []}
    for l, (s, (scores, targets)) in enumerate(zip(self.sets, test)):
      variants = {"one": scores[..., l], "clc-a": clc_average(scores),
                  "clc-c": np.asarray(mlp_apply(params, jnp.asarray(scores, jnp.float32)), np.float64)}
      for name, matrix in variants.items():
        figures = metrics.retrieval_metrics(matrix, targets)
        out.update({f"{s.name}:{name}/{k}": float(x) for k, x in figures.items()})
        means[name].append(figures["mR"])
    out.update({f"clc/{name}_mR": float(np.mean(x)) for name, x in means.items()})
    return out
