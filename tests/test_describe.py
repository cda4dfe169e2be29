"""describe() on the paper configs: counts near the MURAL paper's, shapes only."""

import functools
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from conftest import load_config
from mural import config_lib
from mural import describe

# MURAL paper 3.2 / A.1, in millions: image tower, token embeddings, total.
PAPER = {
    "align_base": (30, 192, 300),
    "mural_base": (30, 192, 300),
    "mural_large": (66, 64, 430),
    "align_l2": (480, 64, 840),
}


EXACT = {n: dict(zip(("image_tower", "token_embeddings", "text_encoder", "heads", "total"), v)) for n, v in {
    "align_base": (27_288_112, 192_000_000, 85_105_152, 393_728, 304_786_993),
    "mural_base": (27_288_112, 192_000_000, 85_105_152, 787_456, 305_180_721),
    "mural_large": (62_143_440, 64_263_168, 302_376_960, 1_312_000, 430_095_569),
    "align_l2": (467_219_796, 64_263_168, 302_376_960, 1_410_400, 835_270_325),
}.items()}


@functools.cache
def counts_of(name):
  return describe.describe(load_config(name))


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_configs_match_paper_param_counts(name):
  counts = counts_of(name)
  json.dumps(counts)  # main.py prints it.
  image, tokens, total = PAPER[name]
  for key, paper in (("image_tower", image), ("token_embeddings", tokens), ("total", total)):
    assert abs(counts[key] / 1e6 - paper) <= 0.1 * paper, (key, counts[key])
  assert counts == EXACT[name]  # Counted by hand in the closing note of issue 2; ALIGN-BASE's
  # image tower has no 1x1 head conv, hence 27.3M against the paper's 30M (which includes it).


def test_transformer_sizes():
  base, large = counts_of("mural_base"), counts_of("mural_large")
  # BERT-Base: 12 x 7.08M layers + 64 x 768 positions + LN = 85.1M (paper: 78M).
  assert base["text_encoder"] == 12 * 7_087_872 + 64 * 768 + 2 * 768
  assert abs(large["text_encoder"] / 1e6 - 300) <= 0.1 * 300  # BERT-Large, paper 300M.
  assert base["heads"] == 2 * (768 * 512 + 512)  # MURAL: i2t and t2t heads.
  assert counts_of("align_base")["heads"] == 768 * 512 + 512  # i2t only.


def test_config_errors_are_one_line():
  config = load_config("mural_large")
  config.model.heads.embed_dim = 512  # B7 pools to 640.
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.heads\.embed_dim: .*640"):
    describe.describe(config)
  config = load_config("mural_base")
  config.model.text.num_heads = 7
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.num_heads: "):
    describe.describe(config)
  config = load_config("align_base")
  config.model.image.width_coefficient = -1.0
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.image\.width_coefficient: "):
    describe.describe(config)


def test_language_lists_can_be_overridden_on_the_command_line():
  """config_flags overrides tuples, not lists: the fields a run sets per language are tuples."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  argv = ["mural", f"--config={ROOT / 'configs' / 'demo.py'}",
          "--config.data.languages=('en', 'de', 'sw')",
          "--config.data.synthetic.languages=('en', 'de', 'sw')",
          "--config.data.synthetic.translation_pair_list=('en-sw', 'de-sw')"]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True, sys_argv=argv)
  flag_values(argv)
  config = flag_values.config
  assert config.data.languages == ("en", "de", "sw")
  settings = synthetic.Settings.from_config(config)  # Validates them together.
  assert tuple(settings.languages) == ("en", "de", "sw")
  assert config.data.synthetic.translation_pair_list == ("en-sw", "de-sw")


# The family's paper-size configs, every group counted by hand from the papers' layer sizes (the
# systems' docstrings say where a paper is silent). L = 8 languages of the built-in data.
L = 8
MULE_IMAGE = 512 * 2048 + 2048 + 2 * 2048 + 2048 * 512 + 512  # B5's 512-d pool -> FC 2048, BN, FC 512.
LSTM_1024 = 512 * 4 * 1024 + 1024 * 4 * 1024 + 4 * 1024 + 1024 * 512 + 512  # LSTM over 512-d, FC 512.
CLASSIFIER = 512 * L + L  # MULE's / SMALR's adversarial language classifier on u.
BERT_4x512 = 4 * (4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 2 * 2 * 512) + 64 * 512 + 2 * 512
D128_HEAD = 512 * 512 + 512 + 512 * 128 + 128  # Globetrotter's prediction head to D = 128.
MLM_HEAD = 512 * 512 + 512 + 2 * 512 + 32_000  # BERT's cloze transform and output bias (tied table).
FAMILY = {  # image_tower, token_embeddings, text_encoder, heads, total - (the other four).
    "mule": (MULE_IMAGE, L * 20_000 * 300, L * (300 * 512 + 512) + LSTM_1024, 0, CLASSIFIER),
    # PARALLEL-EmbN: each language its own LSTM and FC; no classifier.
    "mule.py:parallel_embn": (MULE_IMAGE, L * 20_000 * 300, L * (300 * 512 + 512 + LSTM_1024), 0, 0),
    # HEM: per language K + 2 = 5,002 specific 50-d rows and its FC to 512; 40k latent 50-d rows and
    # one FC; the [MASK] vector. The rest: the classifier and MCLM's two FCs (1024 -> 1024).
    "smalr": (MULE_IMAGE, L * 5_002 * 50 + 40_000 * 50, L * (50 * 512 + 512) + 50 * 512 + 512 + 512 + LSTM_1024,
              0, CLASSIFIER + 2 * (1024 * 1024 + 1024)),
    # Phase 1: learned 300-d word vectors, 40k latent rows, the word -> latent-space FC.
    "smalr.py:pretrain": (0, L * 25_000 * 300 + 40_000 * 50, 300 * 50 + 50, 0, 0),
    # Linear 2048 -> 1024 over the frozen features; one 20k x 300 union table; a GRU of 1024
    # (flax's cell: input kernels and biases, recurrent kernels, the candidate's recurrent bias).
    "kadar": (2048 * 1024 + 1024, 20_000 * 300, 3 * (300 * 1024 + 1024) + 3 * 1024 * 1024 + 1024, 0, 0),
    # ResNet-18 = torchvision's 11,689,512 less its 1000-way classifier; BERT 4 x 512 (MLP 2048, 64
    # positions) on a 32k table.
    "globetrotter": (11_689_512 - (512 * 1000 + 1000), 32_000 * 512, BERT_4x512, 2 * D128_HEAD + MLM_HEAD, 0),
    "globetrotter.py:text_only": (0, 32_000 * 512, BERT_4x512, MLM_HEAD, 0),
}


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_family_configs_at_paper_sizes_count_by_hand(name):
  image, tokens, text, heads, other = FAMILY[name]
  path = ROOT / "configs" / (name if ".py" in name else f"{name}.py")
  counts = describe.describe(config_lib.from_file(path))
  assert counts == {"image_tower": image, "token_embeddings": tokens, "text_encoder": text,
                    "heads": heads, "total": image + tokens + text + heads + other}
  if name == "smalr":
    assert counts["total"] < 20e6  # The paper: fewer than 20M parameters.


def test_a_frozen_backbone_is_neither_compiled_nor_read_to_count_parameters():
  """MULE's frozen B5 is a constant of its image tower, not a parameter: describe counts without
  it (compiling its init took 21 s) and reads no backbone_workdir."""
  import jax  # pylint: disable=g-import-not-at-top
  lowered = []
  listener = lambda event, seconds, **_: lowered.append(event) if "jaxpr_to_mlir" in event else None
  config = load_config("mule")
  config.model.image.backbone_workdir = "/nonexistent/run"  # A run's workdir would be a restore.
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    counts = describe.describe(config)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert counts["image_tower"] == MULE_IMAGE and not lowered


def test_no_system_loads_tensorflow_to_count_parameters():
  """describe reads shapes only (Globetrotter's cloze masking once imported the tokenizer, and
  with it TensorFlow, 3 s)."""
  code = ("import json, sys; from mural import config_lib, describe\n"
          "for name in sys.argv[1:]:\n"
          "  print(json.dumps(describe.describe(config_lib.from_file(name))))\n"
          "print('tensorflow' in sys.modules)")
  names = [f"configs/{name}.py" for name in ("globetrotter", "mule", "mural_base")]
  r = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True,
                     timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr[-2000:]
  *counts, loaded = r.stdout.strip().splitlines()
  assert json.loads(counts[0])["total"] == sum(FAMILY["globetrotter"]) and loaded == "False"
