"""A set's rows as printed tables: one per split, the paper's published figures beneath."""

from typing import Sequence

from mural import metrics
from mural.public_sets.parts import PublicSet


# Column labels of the printed tables (the JSON keeps CLIP_benchmark's names).
_LABELS = {"mean_recall": "mR", "translation_accuracy_l2r": "l2r", "translation_accuracy_r2l": "r2l",
           "translation_accuracy": "acc"}
_LABELS.update({f"image_retrieval_recall@{k}": f"t2i R@{k}" for k in metrics.RECALL_KS})
_LABELS.update({f"text_retrieval_recall@{k}": f"i2t R@{k}" for k in metrics.RECALL_KS})
_LABELS.update({"acc1": "top-1", "acc5": "top-5", "mean_per_class_recall": "per-class"})
_LABELS.update({f"{prefix}_recall@{k}": f"{short} R@{k}" for k in metrics.RECALL_KS
                for prefix, short in (("text_to_text", "t2t"), ("image_to_image", "i2i"))})
_LABELS.update({f"{prefix}_mean_rank": f"{short} avg r" for prefix, short in (
    ("text_retrieval", "i2t"), ("image_retrieval", "t2i"), ("text_to_text", "t2t"), ("image_to_image", "i2i"))})
_LABELS.update({f"{kind}_spearman{tail}": f"{kind.upper()}{label}" for kind in ("sts", "sis", "sits")
                for tail, label in (("", ""), ("_std", " std"), ("_all_pairs", " all"))})


def _shown(metric: str, value: float) -> float:
  """Percent, but mean ranks as ranks."""
  return value if metric.endswith("_mean_rank") else 100 * value


def _cells(figures: dict, names: Sequence[str], width: int) -> str:
  return "".join(f"{figures[n]:>{width}.1f}" if n in figures else f"{'-':>{width}}" for n in names)


def table(name: str, public_set: PublicSet, rows: Sequence[dict]) -> str:
  """One table per split of `rows` (percent), the set's published figures beneath as reference rows
  (folds are in the JSON lines; their mean is the table)."""
  out = []
  for split in dict.fromkeys(r["split"] for r in rows if "/fold" not in r["split"]):
    mine = [r for r in rows if r["split"] == split]
    languages = list(dict.fromkeys(r["language"] for r in mine))
    names = list(dict.fromkeys(r["metric"] for r in mine))
    value = {(r["language"], r["metric"]): r["value"] for r in mine}
    width = max(len(_LABELS.get(n, n)) for n in names) + 2
    out.append(f"{name} {split}")
    out.append(f"{'':>10}" + "".join(f"{_LABELS.get(n, n):>{width}}" for n in names))
    for lang in languages:
      cells = "".join(f"{_shown(n, value[lang, n]):>{width}.1f}" if (lang, n) in value else f"{'-':>{width}}"
                      for n in names)
      out.append(f"{lang:>10}" + cells)
    headline = public_set.headline
    retrieval = [lang for lang in languages if (lang, headline) in value]
    references = public_set.references.get(split, {})
    label = max([len("this model"), *map(len, references)]) + 2  # The reference rows' label column.
    by_metric = [n for n in names if any(n in figures for figures in references.values())]
    if by_metric and len(languages) == 1:  # Figures by metric, of the one language (CxC).
      out.append("  beside the paper's (percent; mean ranks as ranks):")
      out.append(f"{'':>{label}}" + "".join(f"{_LABELS.get(n, n):>{width}}" for n in by_metric))
      mine = {n: _shown(n, value[languages[0], n]) for n in by_metric if (languages[0], n) in value}
      out.append(f"{'this model':>{label}}" + _cells(mine, by_metric, width))
      for model, figures in references.items():
        out.append(f"{model:>{label}}" + _cells(figures, by_metric, width))
    elif retrieval and references:
      out.append(f"  {_LABELS.get(headline, headline)} (percent) beside the paper's:")
      out.append(f"{'':>{label}}" + "".join(f"{lang:>7}" for lang in retrieval))
      out.append(f"{'this model':>{label}}" + "".join(f"{100 * value[lang, headline]:>7.1f}" for lang in retrieval))
      for model, figures in references.items():
        out.append(f"{model:>{label}}" + "".join(f"{figures[lang]:>7.1f}" if lang in figures else f"{'-':>7}"
                                           for lang in retrieval))
  return "\n".join(out)
