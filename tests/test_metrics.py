"""Recall maths against a brute-force reference and hand-computed cases."""

import numpy as np
import pytest

from mural import metrics


def brute_force_recalls(sim, text_to_image, ks=(1, 5, 10)):
  """Loops over queries, sorting candidates (ties broken against the answer)."""
  m, n = sim.shape
  out = {}
  i2t_hits = {k: [] for k in ks}
  for img in range(n):
    relevant = [t for t in range(m) if text_to_image[t] == img]
    if not relevant:
      continue
    # Sort descending; among equal scores irrelevant texts come first (pessimistic).
    order = sorted(range(m), key=lambda t: (-sim[t, img], t in relevant))
    first = min(order.index(t) for t in relevant)
    for k in ks:
      i2t_hits[k].append(first < k)
  t2i_hits = {k: [] for k in ks}
  for t in range(m):
    order = sorted(range(n), key=lambda j: (-sim[t, j], j == text_to_image[t]))
    rank = order.index(text_to_image[t])
    for k in ks:
      t2i_hits[k].append(rank < k)
  for k in ks:
    out[f"i2t_R@{k}"] = 100.0 * np.mean(i2t_hits[k])
    out[f"t2i_R@{k}"] = 100.0 * np.mean(t2i_hits[k])
  out["mR"] = np.mean([out[f"{d}_R@{k}"] for d in ("i2t", "t2i") for k in ks])
  return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_retrieval_metrics_match_brute_force(seed):
  rng = np.random.default_rng(seed)
  n_images = 23
  text_to_image = np.concatenate([np.arange(n_images), rng.integers(0, n_images, 20)])
  sim = rng.normal(size=(len(text_to_image), n_images))
  sim[:, 3] = sim[:, 4]  # Ties between images ...
  sim[5] = sim[6]  # ... and between texts.
  sim = np.round(sim, 1)  # Plenty more ties.
  got = metrics.retrieval_metrics(sim, text_to_image)
  want = brute_force_recalls(sim, text_to_image)
  assert got.keys() == want.keys()
  for key in want:
    assert got[key] == pytest.approx(want[key]), key


def test_hand_computed_case():
  # 3 images, 4 texts: texts 0,1 -> image 0, text 2 -> image 1, text 3 -> image 2.
  sim = np.array([[0.9, 0.1, 0.0],
                  [0.2, 0.8, 0.1],
                  [0.3, 0.7, 0.2],
                  [0.4, 0.5, 0.6]])
  t2i = np.array([0, 0, 1, 2])
  got = metrics.retrieval_metrics(sim, t2i, ks=(1, 2))
  # t2i ranks: text0 0, text1 1 (0.8 > 0.2), text2 0, text3 0 -> R@1 75, R@2 100.
  assert got["t2i_R@1"] == pytest.approx(75.0)
  assert got["t2i_R@2"] == pytest.approx(100.0)
  # i2t: image0 best caption text0 (0.9) rank 0; image1 text2 (0.7) behind text1 (0.8) -> 1;
  # image2 text3 (0.6) rank 0.
  assert got["i2t_R@1"] == pytest.approx(200 / 3)
  assert got["i2t_R@2"] == pytest.approx(100.0)


def test_constant_scores_give_chance_not_perfect_recall():
  sim = np.zeros((10, 10))
  got = metrics.retrieval_metrics(sim, np.arange(10))
  assert got["t2i_R@1"] == 0.0 and got["i2t_R@10"] == 100.0


def brute_force_translation(sim):
  """Percent of rows (left -> right) and of columns (right -> left) whose own pair scores above
  every other candidate (a tie counts against the model), by explicit loops."""
  n = len(sim)
  l2r = [all(sim[i, j] < sim[i, i] for j in range(n) if j != i) for i in range(n)]
  r2l = [all(sim[j, i] < sim[i, i] for j in range(n) if j != i) for i in range(n)]
  l2r, r2l = 100.0 * np.mean(l2r), 100.0 * np.mean(r2l)
  return {"l2r_acc": l2r, "r2l_acc": r2l, "acc": (l2r + r2l) / 2}


def test_translation_accuracy():
  sim = np.eye(4)
  sim[1, 2] = 2.0  # Left 1 now prefers right 2 over its own translation.
  got = metrics.translation_accuracy_from_embeddings(sim, np.eye(4))  # Scores sim @ I = sim.
  assert got["l2r_acc"] == pytest.approx(75.0)
  # Column 2: left 1 scores 2.0 > left 2's 1.0, so right 2 -> left 2 fails too.
  assert got["r2l_acc"] == pytest.approx(75.0)
  with pytest.raises(ValueError, match="aligned"):
    metrics.translation_accuracy_from_embeddings(np.zeros((2, 3)), np.zeros((3, 3)))
  with pytest.raises(ValueError, match=r"^translation pairs: none to score \(0 aligned rows\)$"):
    metrics.translation_accuracy_from_embeddings(np.zeros((0, 3)), np.zeros((0, 3)))


def test_bad_indices_are_a_clear_error():
  with pytest.raises(ValueError, match="indices"):
    metrics.retrieval_metrics(np.zeros((2, 2)), np.array([0, 2]))


def test_chance_recall_matches_simulation():
  rng = np.random.default_rng(0)
  hits = [(rng.permutation(20)[:5] < 2).any() for _ in range(20000)]
  assert metrics.chance_recall(20, 5, num_relevant=2) == pytest.approx(100 * np.mean(hits), abs=1.0)
  assert metrics.chance_recall(100, 1) == pytest.approx(1.0)


@pytest.mark.parametrize("block_elements", [1, 7, 64, 1 << 26])
def test_blockwise_recalls_equal_the_full_matrix(monkeypatch, block_elements):
  """Same ranks and ties from blocks of rows / columns as from texts @ images.T (the evaluator's
  figures), one block down to one row; duplicated images and captions make exact ties."""
  monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", block_elements)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(17, 6))
  images[5] = images[3]  # Tied candidates.
  text_to_image = np.concatenate([np.arange(17), rng.integers(0, 17, 12)])
  text_to_image[text_to_image == 9] = 8  # Image 9 has no caption: left out of i2t.
  texts = images[text_to_image] + 0.8 * rng.normal(size=(len(text_to_image), 6))
  texts[-1] = texts[0]  # Tied queries.
  texts, images = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (texts, images))
  want = metrics.retrieval_metrics(texts @ images.T, text_to_image)
  got = metrics.retrieval_metrics_from_embeddings(texts, images, text_to_image)
  assert got == want
  assert 0 < want["mR"] < 100
  with pytest.raises(ValueError, match="indices must lie in"):
    metrics.retrieval_metrics_from_embeddings(texts, images[:3], text_to_image)


@pytest.mark.parametrize("block_elements", [1, 5, 1 << 26])
def test_blockwise_translation_accuracy_equals_a_brute_force(monkeypatch, block_elements):
  """The same first places and ties from blocks of rows as a float64 brute force over left @ right.T,
  both ways; a duplicated sentence ties exactly."""
  monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", block_elements)
  rng = np.random.default_rng(1)
  left = rng.normal(size=(13, 5))
  right = left + 0.9 * rng.normal(size=(13, 5))
  right[4] = right[2]  # Tied candidates both ways.
  left[7] = left[8]
  want = brute_force_translation(left @ right.T)
  assert metrics.translation_accuracy_from_embeddings(left, right) == want
  assert 0 < want["l2r_acc"] < 100 and 0 < want["r2l_acc"] < 100
  with pytest.raises(ValueError, match="aligned"):
    metrics.translation_accuracy_from_embeddings(left, right[:3])


def test_translation_evaluator_embeds_a_shared_language_once():
  """Sets that share a language's arrays (Multi30k's pairs) get the same scores as separate copies,
  for one embedding call per array (the embedder here: each row's ids, as unit vectors)."""
  from mural import evaluate  # pylint: disable=g-import-not-at-top
  from mural.data import eval_data  # pylint: disable=g-import-not-at-top

  class RowsAsVectors:
    calls = 0

    def texts(self, variables, ids, mask, head):
      del variables, mask, head
      self.calls += 1
      x = ids.astype(np.float64)
      return x / np.linalg.norm(x, axis=1, keepdims=True)

  rng = np.random.default_rng(0)
  en, de, fr = (rng.integers(1, 50, (20, 6)) for _ in range(3))
  de[:5], fr[3:8] = en[:5], en[3:8]  # Some exact translations, some ties.
  ones = np.ones_like(en)
  shared = [eval_data.TranslationEvalSet(n, a, ones, b, ones) for n, a, b in (("en-de", en, de), ("en-fr", en, fr),
                                                                               ("de-fr", de, fr))]
  copies = [eval_data.TranslationEvalSet(s.name, s.left_ids.copy(), ones, s.right_ids.copy(), ones) for s in shared]
  embedder = RowsAsVectors()
  got = evaluate.Translation(shared, head=None).run(embedder, None)
  assert embedder.calls == 3
  assert got == evaluate.Translation(copies, head=None).run(RowsAsVectors(), None)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  want = brute_force_translation(unit(en.astype(np.float64)) @ unit(fr.astype(np.float64)).T)
  assert {k: got[f"en-fr/{k}"] for k in want} == want
