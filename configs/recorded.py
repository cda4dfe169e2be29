"""The config a workdir's run recorded (WORKDIR/config.json), as a config file, so that any
field can be overridden, e.g. evaluating a trained run on more held-out scenes:

    python -m mural.main --config=configs/recorded.py:/tmp/mural_demo --workdir=/tmp/mural_demo \
      --mode=eval --config.data.synthetic.eval_scenes=400

Without overrides, `--workdir` alone reads the same record (mural/main.py).
"""

from mural import config_lib
from mural import systems


def get_config(workdir=None):
  if not workdir:
    raise config_lib.ConfigError("configs/recorded.py reads a workdir's record: "
                                 "--config=configs/recorded.py:WORKDIR")
  return systems.recorded(workdir)
