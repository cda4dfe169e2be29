"""Translation by retrieval as Globetrotter scores it, and word translation by Procrustes.

Sentence level (paper 5.2): N scenes captioned in all M languages, N * M
sentences. Each sentence is a query against the other N * M - 1; its M - 1
positives are its scene's captions in the other languages; the score is the
share of positives among its top M - 1, averaged over queries (chance
(M - 1) / (N M - 1)). `MultiwayTranslation` runs it on the eval sets (one
per language, the same scenes) with a text head.

Word level (paper 3.4): the rows of two languages' word embeddings are
aligned by an orthogonal map (Procrustes, Schönemann 1966) fitted on anchor
pairs, the mutual nearest neighbours under CSLS with k = 5 neighbours
(Conneau et al. 2018's refinement, the 'standard practice' the paper
follows), refitted on the new anchors a few times.
"""

from typing import Any, Dict, Optional, Sequence

import numpy as np

from mural import lazy_import
from mural import metrics

# TensorFlow and the built-in data's modules: loaded for the word-translation evaluation only.
tf = lazy_import.module("tensorflow")
synthetic = lazy_import.module("mural.data.synthetic")
tokenizer_lib = lazy_import.module("mural.data.tokenizer")


def multiway_translation_score(embeddings: np.ndarray, scene: np.ndarray, lang: np.ndarray) -> Dict[str, float]:
  """Share of each query's M - 1 translations ranked in its top M - 1, among all other sentences.

  embeddings [S, D] (L2-normalised; S = N * M), scene [S] and lang [S]
  integer ids; every scene must have exactly one sentence per language.
  Ties are broken by position (a stable sort of -similarity). Returns
  {'mean': the score in percent, <lang id>: the score of that language's
  queries in percent, 'same_language': percent of the top M - 1 in the
  query's own language (100: languages in separate clusters)}.
  """
  emb = np.asarray(embeddings, np.float64)
  scene, lang = np.asarray(scene), np.asarray(lang)
  langs = np.unique(lang)
  m = len(langs)
  counts = np.unique(scene * (lang.max() + 1) + lang, return_counts=True)[1]
  if m < 2 or np.any(counts != 1) or len(scene) != m * len(np.unique(scene)):
    raise ValueError("multiway_translation_score: needs every scene once in each of >= 2 languages")
  sims = emb @ emb.T
  np.fill_diagonal(sims, -np.inf)  # A query never retrieves itself.
  top = np.argsort(-sims, axis=1, kind="stable")[:, :m - 1]
  hits = (scene[top] == scene[:, None]).sum(axis=1) / (m - 1)
  out = {"mean": 100.0 * float(hits.mean()), "same_language": 100.0 * float(np.mean(lang[top] == lang[:, None]))}
  out.update({int(l): 100.0 * float(hits[lang == l].mean()) for l in langs})
  return out


class MultiwayTranslation:
  """Translation by retrieval over every language of the eval sets (eval_data.EvalSet per
  language over the same scenes; the first caption of each scene is its sentence)."""

  def __init__(self, sets: Sequence[Any], head: Optional[str], name: str = "translation_retrieval"):
    self.sets, self.head, self.name = list(sets), head, name

  def run(self, embedder, variables) -> Dict[str, float]:
    embs, scenes, langs = [], [], []
    for l, s in enumerate(self.sets):
      scene_ids, first = np.unique(s.text_to_image, return_index=True)
      embs.append(embedder.texts(variables, s.text_ids[first], s.text_mask[first], self.head))
      scenes.append(scene_ids)
      langs.append(np.full(len(first), l))
    scores = multiway_translation_score(np.concatenate(embs), np.concatenate(scenes), np.concatenate(langs))
    out = {f"{self.name}/mean": scores["mean"], f"{self.name}/same_language": scores["same_language"]}
    out.update({f"{self.name}/{s.name}": scores[l] for l, s in enumerate(self.sets)})
    return out


# ---- Word translation ------------------------------------------------------------------


def procrustes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """The orthogonal W minimising ||x W - y||_F for paired rows: U V^T of svd(x^T y)."""
  u, _, vt = np.linalg.svd(np.asarray(x, np.float64).T @ np.asarray(y, np.float64))
  return u @ vt


def csls(x: np.ndarray, y: np.ndarray, k: int = 5) -> np.ndarray:
  """[n, m] CSLS scores 2 cos(x_i, y_j) - r_y(x_i) - r_x(y_j), r the mean cosine of the k nearest
  rows of the other set (Conneau et al. 2018): it discounts hubs."""
  cos = metrics.unit_rows(x) @ metrics.unit_rows(y).T
  kx, ky = min(k, cos.shape[1]), min(k, cos.shape[0])
  r_x = np.mean(-np.sort(-cos, axis=1)[:, :kx], axis=1)  # Of each x_i, over y.
  r_y = np.mean(-np.sort(-cos, axis=0)[:ky, :], axis=0)  # Of each y_j, over x.
  return 2 * cos - r_x[:, None] - r_y[None, :]


def mutual_nearest_neighbours(x: np.ndarray, y: np.ndarray, k: int = 5) -> np.ndarray:
  """[P, 2] index pairs (i, j): y_j is x_i's best match under CSLS(k) and x_i is y_j's."""
  s = csls(x, y, k)
  best_y, best_x = np.argmax(s, axis=1), np.argmax(s, axis=0)
  i = np.flatnonzero(best_x[best_y] == np.arange(len(x)))
  return np.stack([i, best_y[i]], axis=1)


def align_words(x: np.ndarray, y: np.ndarray, k: int = 5, iterations: int = 5) -> np.ndarray:
  """W mapping x's rows onto y's space: anchors from mutual nearest neighbours (CSLS, k), Procrustes
  on them, repeated with the anchors of the mapped rows."""
  x, y = metrics.unit_rows(x), metrics.unit_rows(y)
  w = np.eye(x.shape[1])
  for _ in range(iterations):
    pairs = mutual_nearest_neighbours(x @ w, y, k)
    if len(pairs) == 0:
      break
    w = procrustes(x[pairs[:, 0]], y[pairs[:, 1]])
  return w


def word_translation_accuracy(x: np.ndarray, y: np.ndarray, gold: Sequence[tuple], k: int = 5,
                              iterations: int = 5) -> float:
  """Percent of gold (i, j) pairs whose x_i, mapped by align_words, has y_j as its CSLS best match."""
  w = align_words(x, y, k, iterations)
  best = np.argmax(csls(metrics.unit_rows(x) @ w, y, k), axis=1)
  return 100.0 * float(np.mean([best[i] == j for i, j in gold]))


def concept_tokens(token_sets: Sequence[set], concepts: Sequence[set], min_f1: float = 0.9) -> Dict[Any, int]:
  """A gold lexicon from aligned captions: for each concept, the token that marks it.

  token_sets[k]: the token ids of caption k (one language); concepts[k]: the
  concepts of the scene it describes. A concept's token is the one whose
  presence best matches the concept's (F1 over captions), kept when F1 >=
  min_f1: the word for 'red' occurs in (nearly) exactly the captions of red
  scenes. Concepts with no such token (inflected away, split differently) are
  left out.
  """
  tokens = sorted(set().union(*token_sets))
  out = {}
  for concept in sorted(set().union(*concepts), key=str):
    has = np.array([concept in c for c in concepts])
    best, best_f1 = None, 0.0
    for t in tokens:
      present = np.array([t in s for s in token_sets])
      tp = np.sum(present & has)
      f1 = 2 * tp / max(present.sum() + has.sum(), 1)
      if f1 > best_f1:
        best, best_f1 = t, f1
    if best is not None and best_f1 >= min_f1:
      out[concept] = best
  return out


class WordTranslation:
  """Word translation between every ordered pair of languages over the token table's rows.

  lexicon: {lang: {concept: token id}} (concept_tokens); vocab: {lang: token
  ids seen in that language's captions} (the rows searched). For a pair
  (a, b), each concept word of a is translated to the CSLS-nearest row of b's
  tokens, before ('word_translation/nn') and after ('.../procrustes') the
  Procrustes map fitted on mutual-nearest-neighbour anchors; the gold answer
  is b's word for the same concept. Percent, mean over pairs.
  """

  def __init__(self, lexicon: Dict[str, Dict[Any, int]], vocab: Dict[str, Sequence[int]],
               table_path: Sequence[str], k: int = 5):
    self.lexicon, self.vocab, self.table_path, self.k = lexicon, vocab, tuple(table_path), k

  def run(self, embedder, variables) -> Dict[str, float]:
    del embedder
    table = variables["params"]
    for key in self.table_path:
      table = table[key]
    table = np.asarray(table, np.float64)
    nn_scores, procrustes_scores = [], []
    for a in self.lexicon:
      for b in self.lexicon:
        common = sorted(set(self.lexicon[a]) & set(self.lexicon[b]), key=str)
        if a == b or not common:
          continue
        rows_a, rows_b = list(self.vocab[a]), list(self.vocab[b])
        x, y = table[rows_a], table[rows_b]
        gold = [(rows_a.index(self.lexicon[a][c]), rows_b.index(self.lexicon[b][c])) for c in common]
        nn = np.argmax(csls(x, y, self.k), axis=1)
        nn_scores.append(100.0 * np.mean([nn[i] == j for i, j in gold]))
        procrustes_scores.append(word_translation_accuracy(x, y, gold, self.k))
    if not nn_scores:
      return {}
    return {"word_translation/nn": float(np.mean(nn_scores)),
            "word_translation/procrustes": float(np.mean(procrustes_scores))}


def synthetic_word_translation(config, tokenizer, table_path: Sequence[str]) -> Optional[WordTranslation]:
  """WordTranslation on the built-in eval scenes: concepts are their objects' shapes and colours;
  each language's gold word is found in its captions (concept_tokens)."""
  data = synthetic.build_eval_data(config)
  per_scene = config.data.synthetic.eval_captions_per_scene
  # Shapes and colours: nouns and adjectives with one stem each. Sizes and relations are left
  # out: 'large' is in most multi-object scenes, so an article of those scenes can pass for it.
  concepts = [{("shape", o.shape) for o in d.objects} | {("colour", o.colour) for o in d.objects}
              for d in data.descriptions]
  lexicon, vocab = {}, {}
  languages = list(config.data.languages)
  for lang in languages:
    if lang not in data.languages:
      continue
    captions = data.languages[lang].captions[::per_scene]
    ids, mask = tokenizer.tokenize(tf.constant(captions), tf.fill([len(captions)], languages.index(lang)))
    ids, mask = ids.numpy(), mask.numpy()
    reserved = len(tokenizer_lib.RESERVED_TOKENS)
    token_sets = [{int(t) for t, m in zip(row, mrow) if m and t >= reserved} for row, mrow in zip(ids, mask)]
    lexicon[lang] = concept_tokens(token_sets, concepts)
    vocab[lang] = sorted(set().union(*token_sets))
  return WordTranslation(lexicon, vocab, table_path) if len(lexicon) > 1 else None
