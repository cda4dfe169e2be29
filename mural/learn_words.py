"""python -m mural.learn_words CONFIG_FILE OUT_DIR: learn OUT_DIR/words.json from the config's training
sources (for config.data.word_vocab_path, e.g. before loading FastText vectors for it)."""

import sys

from mural import config_lib
from mural import system
from mural import systems
from mural.data import word_vocab


def main(argv) -> str:
  if len(argv) != 3:
    sys.exit(__doc__)
  config = config_lib.from_file(argv[1])
  return word_vocab.learn(config, system.vocabulary_tasks(systems.get(config), config), argv[2])


if __name__ == "__main__":
  print(main(sys.argv))
