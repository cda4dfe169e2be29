"""Your data, started from public checkpoints: a locked ImageNet image tower and a tuned BERT (LiT).

    python -m mural.import_weights --text=hf_bert:bert-base-multilingual-cased \\
        --image=keras_efficientnet:efficientnetb0_notop.h5 --out=/data/imported
    python -m mural.main --config=configs/lit.py:/data/mine,/data/imported --workdir=/tmp/lit

The first argument is configs/custom.py's folder (the converter's output: your pairs, held-out
data, translation pairs); the second is what mural.import_weights wrote. The towers take the
import's architecture, input normalisation and tokenizer (config_lib.towers_from) and start
from its tensors; the image tower is locked (Zhai et al. 2022: inference mode, no gradient, no
optimizer state), so only the text tower and its head learn to meet the image embeddings. To
tune the image tower too, at a tenth of the text tower's rate ("unlocked" LiT):
--config.model.image.locked=False --config.model.image.learning_rate_scale=0.1.

Images are seen at ImageNet's 224 px (eval: resize to 256, centre crop), the size the
checkpoints were trained at; on a CPU, --config.data.image_size=128 --config.data.eval_resize=146
costs a third of that. The rates and schedule are configs/custom.py's, lowered for towers that
already know images and text; they are a start, not a tuned result (public weights cannot be
fetched where mural is developed, so no run from them is measured here).
"""

import json
import pathlib

from mural import config_lib


def get_config(args: str = ""):
  folder, _, imported = args.partition(",")
  if not folder or not imported:
    raise config_lib.ConfigError("configs/lit.py takes FOLDER,IMPORTED: your data folder (as "
                                 "configs/custom.py) and a directory mural.import_weights wrote")
  manifest_path = pathlib.Path(imported).expanduser() / "manifest.json"
  if not manifest_path.exists():
    raise config_lib.ConfigError(f"configs/lit.py: {manifest_path} does not exist: write it with "
                                 "python -m mural.import_weights --text=... --image=... --out=...")
  towers = json.loads(manifest_path.read_text()).get("towers", {})
  if "image" not in towers:
    raise config_lib.ConfigError(f"configs/lit.py: {imported} holds no image tower to lock "
                                 "(import one with --image=FORMAT:PATH)")
  c = config_lib.sibling(__file__, f"custom.py:{folder}")
  config_lib.towers_from(c, str(pathlib.Path(imported).expanduser()))
  c.model.image.locked = True
  # MURAL embeds images as the pooled tower output: the text head projects to its width.
  c.model.heads.embed_dim = towers["image"]["output_dim"]
  c.data.image_size = 224
  c.data.eval_resize = 256
  c.tasks.i2t.learning_rate = 1e-3
  c.tasks.t2t.learning_rate = 2e-3
  return c
