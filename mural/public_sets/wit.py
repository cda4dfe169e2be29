"""WIT: image<->text retrieval per language on test splits drawn from WIT's training TSVs by
mural.data.wit_splits' rule (mR: MURAL Table 3)."""

from typing import Optional

import numpy as np

from mural.data import img2dataset_files
from mural.data import wit_splits
from mural.public_sets.parts import PublicSet, Retrieval


def read(folder: str, images: Optional[str], log) -> list:
  """The test split of each language wit_splits wrote to `folder`, its images found by url in
  `images` (img2dataset's files output of the folder's test_urls.txt). A language is scored on
  all its images or the set is refused: a split drawn by rule is comparable only whole."""
  if not images:
    raise ValueError(f"wit: needs its images (--images=wit:DIR): img2dataset's --output_format=files "
                     f"download of {folder}/{wit_splits.TEST_URLS}")
  splits = wit_splits.read_split(folder, "test")
  files = img2dataset_files.files_by_url(images)
  missing = {lang: [url for url, _ in pairs if url not in files] for lang, pairs in splits.items()}
  missing = {lang: urls for lang, urls in missing.items() if urls}
  if missing:
    counts = ", ".join(f"{lang} {len(urls)} of {len(splits[lang])}" for lang, urls in missing.items())
    raise ValueError(f"wit: test images not in {images} (by url): {counts}, e.g. {next(iter(missing.values()))[0]}; "
                     "each language is scored on all its images: download the missing ones again")
  skipped = sorted(set(wit_splits.LANGUAGES) - set(splits))
  if skipped:
    log(f"wit: no test split for {', '.join(skipped)} in {folder}")
  return [Retrieval("test", lang, [files[url] for url, _ in pairs], [caption for _, caption in pairs],
                    np.arange(len(pairs))) for lang, pairs in splits.items()]


_LANGUAGES = wit_splits.LANGUAGES


def _row(*values):
  """A Table 3 row in its column order; n/a (no translation system) left out."""
  return {lang: v for lang, v in zip(_LANGUAGES, values) if v is not None}


SET = PublicSet(read, "mean_recall", {"test": {
    # MURAL, Table 3: mR on the paper's own WIT test splits (not published; these splits follow
    # mural.data.wit_splits' rule, so figures compare in scale, not exactly). ALIGN-BASE-EN is
    # translate-test. Fine-tuned: on each language's WIT train split.
    "ALIGN-BASE-EN zero-shot (paper)": _row(46.5, 33.9, 42.3, 32.4, 29.9, 36.2, 40.1, 39.2, 40.5,
                                            30.0, 23.4, 26.1, 27.3, 33.6, 34.9, 41.6, None),
    "ALIGN-BASE zero-shot (paper)": _row(46.7, 33.5, 45.0, 26.5, 33.6, 35.2, 30.9, 29.9, 31.4,
                                         21.2, 15.6, 12.9, 8.9, 23.9, 31.0, 33.1, 24.0),
    "MURAL-BASE zero-shot (paper)": _row(46.4, 33.9, 44.8, 31.5, 34.3, 35.6, 33.7, 33.2, 34.7,
                                         35.3, 24.1, 20.8, 21.4, 33.0, 35.7, 39.1, 26.1),
    "MURAL-LARGE zero-shot (paper)": _row(60.7, 46.1, 60.0, 43.6, 48.1, 49.9, 45.7, 45.8, 49.8,
                                          45.7, 33.7, 30.8, 33.4, 45.6, 45.6, 52.4, 37.7),
    "ALIGN-BASE-EN fine-tuned (paper)": _row(66.4, 48.8, 58.5, 44.7, 40.2, 48.2, 55.2, 52.0, 58.0,
                                             47.0, 29.6, 32.7, 37.7, 44.2, 48.4, 53.5, None),
    "ALIGN-BASE fine-tuned (paper)": _row(75.6, 69.2, 76.2, 65.5, 64.4, 78.2, 68.3, 68.3, 75.0,
                                          53.0, 36.3, 35.8, 50.3, 45.0, 72.4, 62.5, 78.1),
    "MURAL-BASE fine-tuned (paper)": _row(77.1, 70.0, 77.2, 68.4, 64.8, 79.6, 70.8, 70.7, 78.2,
                                          64.2, 44.1, 41.9, 59.3, 55.1, 76.4, 67.6, 79.0),
    "MURAL-LARGE fine-tuned (paper)": _row(82.4, 76.3, 83.3, 74.5, 71.9, 86.7, 77.4, 77.4, 85.7,
                                           72.9, 53.5, 51.4, 69.8, 62.3, 82.3, 76.7, 84.2),
}})
