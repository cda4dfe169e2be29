"""The field's evaluation sets by name, each read as released and scored as its paper states.

SETS maps a name to its PublicSet (mural.public_sets.parts): a reader of the release's files into
parts, the metric its paper reports, and the paper's published figures, printed beside a model's
(mural.public_sets.report). A new set is one module here and one entry below.

  xtd10     XTD10: text->image Recall@10 per language over its 1000 COCO images (MURAL Table 4).
  mscoco    Karpathy's test split: 5k images and 1k (the mean over 5 folds), English, and Japanese
            from STAIR Captions where its file is beside the split file (MURAL Table 2); Chinese
            on COCO-CN's own test split where its release is beside it (no paper figure).
  multi30k  Multi30k task 1, every released test split: translation retrieval en <-> de/fr/cs
            and, given the split's images, image<->text retrieval per language (mR: MURAL
            Table 2, test_2016_flickr).
  cxc       Crisscrossed Captions over Karpathy's 5k test split: image<->text, text->text and
            image->image retrieval with its rated positives, and Spearman's rho with its human
            ratings of caption, image and caption-image pairs (MURAL Tables 5 and 6).
  wit       WIT: image<->text retrieval per language on test splits drawn from its training TSVs
            by mural.data.wit_splits' rule (the paper's are unpublished; mR: MURAL Table 3).
  imagenet_folder
            Zero-shot classification (CLIP's prompt ensembles) of a folder in ImageNet's layout,
            per language with CLIP_benchmark's class-name and template files in it.
  builtin   Zero-shot classification of the built-in data's objects and colours, rendered afresh,
            in every language its grammars define (the folder: '' or the languages to score).
"""

from mural.public_sets import builtin
from mural.public_sets import cxc
from mural.public_sets import imagenet_folder
from mural.public_sets import mscoco
from mural.public_sets import multi30k
from mural.public_sets import wit
from mural.public_sets import xtd10

SETS = {
    "xtd10": xtd10.SET,
    "multi30k": multi30k.SET,
    "mscoco": mscoco.SET,
    "cxc": cxc.SET,
    "wit": wit.SET,
    "imagenet_folder": imagenet_folder.SET,
    "builtin": builtin.SET,
}
