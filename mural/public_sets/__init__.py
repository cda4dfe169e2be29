"""The field's evaluation sets by name, each read as released and scored as its paper states.

SETS maps a name to its PublicSet (mural.public_sets.parts): a reader of the release's files into
parts, the metric its paper reports, and the paper's published figures, printed beside a model's
(mural.public_sets.report). A new set is one module here and one entry below.

  xtd10     XTD10: text->image Recall@10 per language over its 1000 COCO images (MURAL Table 4).
  mscoco    Karpathy's test split: 5k images and 1k (the mean over 5 folds), English, and Japanese
            from STAIR Captions where its file is beside the split file (MURAL Table 2).
  multi30k  Multi30k task 1, every released test split: translation retrieval en <-> de/fr/cs
            and, given the split's images, image<->text retrieval per language (mR: MURAL
            Table 2, test_2016_flickr).
"""

from mural.public_sets import mscoco
from mural.public_sets import multi30k
from mural.public_sets import xtd10

SETS = {
    "xtd10": xtd10.SET,
    "multi30k": multi30k.SET,
    "mscoco": mscoco.SET,
}
