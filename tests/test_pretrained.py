"""Public checkpoints into mural's towers (mural.import_weights): each format against a reference
nobody here wrote, on checkpoints with random weights written in the public layouts.

BERT: keras-hub's BertBackbone reads the Hugging Face directory itself (its own converter),
and a NumPy float64 BERT computes transformers' exact-GELU model; EfficientNet and ResNet:
keras.applications' models themselves, eval mode, from RGB pixels.
"""

import json
import math

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from tokenizers import BertWordPieceTokenizer

from mural import config_lib
from mural import import_weights
from mural import models
from mural import saved_variables
from mural.data import tokenizer as tok_lib
from mural.pretrained import CheckpointError
from mural.pretrained import keras_applications
from mural.pretrained import writer

from pretrained_fixtures import bert_vocab
from pretrained_fixtures import randomize_keras
from pretrained_fixtures import write_hf_bert
from pretrained_fixtures import write_keras_h5
from pretrained_fixtures import write_tf_bert
from pretrained_fixtures import write_tf_reference_efficientnet
from pretrained_fixtures import write_timm_efficientnet
from pretrained_fixtures import write_timm_resnet

TEXTS = ["A man in a RED shirt is riding a bike.", "Ein Mann fährt Fahrrad", "我爱北京天安门。",
         "Привет, МИР! Ёлка", "लड़की नमस्ते दुनिया", "😀 smile"]
MAX_LEN = 24


def _import(out, **flags):
  argv = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in flags.items()]
  assert import_weights.main(argv + [f"--out={out}"]) == 0
  config = config_lib.base_config()
  config_lib.towers_from(config, str(out))
  variables, step = saved_variables.read_variables(str(out))
  assert step == 0
  return config, variables


def _text_tower(config, variables, ids, mask):
  tower = models.tower("text", config.model.text, jnp.float32, jnp.float32)
  apply = jax.jit(lambda v, i, m: tower.apply(v, i, m, train=False))
  embedding, aux = apply({"params": variables["params"]["text_tower"]}, ids, mask)
  return np.asarray(embedding), np.asarray(aux["sequence"])


def _relative(ours, reference):
  return float(np.abs(np.asarray(ours, np.float64) - reference).max() / np.abs(reference).max())


@pytest.fixture(scope="module")
def cased_vocab():
  return bert_vocab(lowercase=False)


def test_hf_and_tf_bert_compute_what_keras_hub_computes(tmp_path, cased_vocab):
  """GELU's tanh form ('gelu_new' in transformers' config; what Google's TF code computes for
  'gelu'), which keras-hub's BertBackbone computes."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  weights = write_hf_bert(tmp_path / "hf", cased_vocab, lower_case=False, hidden_act="gelu_new")
  write_tf_bert(tmp_path / "multi_cased_L-2_H-32_A-4", weights, cased_vocab)
  reference = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "hf"))
  rng = np.random.default_rng(0)
  ids = rng.integers(9, len(cased_vocab), (3, MAX_LEN)).astype(np.int32)
  lengths = np.array([MAX_LEN, 5, 2])
  mask = (np.arange(MAX_LEN)[None] < lengths[:, None]).astype(np.int32)
  ref = reference({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask})
  ref_cls, ref_pooled = np.asarray(ref["sequence_output"])[:, 0], np.asarray(ref["pooled_output"])
  imported = {}
  for fmt, path in (("hf_bert", tmp_path / "hf"), ("tf_bert", tmp_path / "multi_cased_L-2_H-32_A-4")):
    for pooler in (False, True):
      out = tmp_path / f"{fmt}_{pooler}"
      config, variables = _import(out, text=f"{fmt}:{path}", max_len=MAX_LEN, pooler=pooler)
      assert config.model.text.gelu_approximate and config.data.text_normalization == "bert_cased"
      embedding, _ = _text_tower(config, variables, ids, mask)
      assert _relative(embedding, ref_pooled if pooler else ref_cls) < 1e-4, (fmt, pooler)
      imported[fmt, pooler] = saved_variables.flat(variables)
      left_out = json.loads((out / "manifest.json").read_text())["towers"]["text"]["not_imported"]
      heads = [n for n in left_out if "cls" in n]
      assert heads and all("pre-training head" in left_out[n] for n in heads)
      assert any("pooler" in n for n in left_out) == (not pooler)
  for key, value in imported["hf_bert", True].items():  # Both formats: the same variables, bit for bit.
    np.testing.assert_array_equal(value, imported["tf_bert", True][key])


def _numpy_bert(w, cfg, ids, mask):
  """transformers' BertModel in NumPy float64 (exact GELU): ([CLS] output, pooled)."""
  f = lambda n: np.asarray(w["bert." + n], np.float64)
  heads = cfg["num_attention_heads"]
  batch, length = ids.shape

  def norm(x, n):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-12) * f(n + ".weight") + f(n + ".bias")

  x = (f("embeddings.word_embeddings.weight")[ids] + f("embeddings.position_embeddings.weight")[:length]
       + f("embeddings.token_type_embeddings.weight")[0])
  x = norm(x, "embeddings.LayerNorm")
  erf = np.vectorize(math.erf)
  for i in range(cfg["num_hidden_layers"]):
    p = f"encoder.layer.{i}."
    linear = lambda v, n: v @ f(p + n + ".weight").T + f(p + n + ".bias")
    q, k, v = (linear(x, f"attention.self.{n}").reshape(batch, length, heads, -1)
               for n in ("query", "key", "value"))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = np.where(mask[:, None, None, :] > 0, scores, -1e30)
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", attn, v).reshape(batch, length, -1)
    x = norm(x + linear(o, "attention.output.dense"), p + "attention.output.LayerNorm")
    y = linear(x, "intermediate.dense")
    y = 0.5 * y * (1 + erf(y / math.sqrt(2)))
    x = norm(x + linear(y, "output.dense"), p + "output.LayerNorm")
  pooled = np.tanh(x[:, 0] @ f("pooler.dense.weight").T + f("pooler.dense.bias"))
  return x[:, 0], pooled


@pytest.mark.parametrize("lower_case", [False, True])
def test_hf_bert_text_to_embedding_equals_a_float64_reference(tmp_path, lower_case):
  """Exact GELU ('gelu'), the imported vocabulary and casing: mural's tokenizer gives the
  `tokenizers` ids, and the tower the reference's [CLS] output and pooled output."""
  vocab = bert_vocab(lower_case)
  weights = write_hf_bert(tmp_path / "hf", vocab, lower_case=lower_case, seed=1)
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  reference_tokenizer = BertWordPieceTokenizer(str(tmp_path / "hf" / "vocab.txt"), lowercase=lower_case)
  reference_tokenizer.enable_truncation(MAX_LEN)
  reference_tokenizer.enable_padding(length=MAX_LEN, pad_id=0)
  encoded = reference_tokenizer.encode_batch(TEXTS)
  ref_ids = np.array([e.ids for e in encoded])
  ref_mask = np.array([e.attention_mask for e in encoded])
  for pooler in (False, True):
    out = tmp_path / f"imported_{pooler}"
    config, variables = _import(out, text=f"hf_bert:{tmp_path / 'hf'}", max_len=MAX_LEN, pooler=pooler)
    assert not config.model.text.gelu_approximate
    tokenizer = tok_lib.Tokenizer(str(out / "vocab.txt"), MAX_LEN, config.data.text_normalization)
    ids, mask = (a.numpy() for a in tokenizer.tokenize(TEXTS))
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(mask, ref_mask)
    embedding, _ = _text_tower(config, variables, ids, mask)
    cls, pooled = _numpy_bert(weights, cfg, ref_ids, ref_mask)
    assert _relative(embedding, pooled if pooler else cls) < 1e-4


def _keras_model(name, size):
  """keras.applications' model (a process's second and later ones name their input normalisation
  'normalization_1', ...: so do the files Keras writes of them)."""
  build = getattr(keras.applications, name)
  return build(weights=None, include_top=False, pooling="avg", input_shape=(size, size, 3))


@pytest.mark.parametrize("name,fmt", [("EfficientNetB0", "keras_efficientnet"),
                                      ("EfficientNetB3", "keras_efficientnet"),
                                      ("ResNet50", "keras_resnet")])
def test_keras_towers_compute_what_keras_computes(tmp_path, name, fmt):
  """Pooled features from RGB pixels in [0, 255], eval mode, random weights and statistics."""
  model = _keras_model(name, 64)
  randomize_keras(model)
  write_keras_h5(model, tmp_path / "weights.h5")
  pixels = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
  if fmt == "keras_resnet":  # Keras' ResNets read BGR less the mean ('caffe' preprocess_input).
    reference = model(keras.applications.resnet50.preprocess_input(pixels.copy()), training=False)
  else:
    reference = model(pixels, training=False)
  config, variables = _import(tmp_path / "imported", image=f"{fmt}:{tmp_path / 'weights.h5'}")
  tower = models.tower("image", config.model.image, jnp.float32, jnp.float32)
  apply = jax.jit(lambda v, x: tower.apply(v, x, train=False)[0])
  features = apply({k: variables[k]["image_tower"] for k in ("params", "batch_stats")}, pixels / 127.5 - 1.0)
  assert _relative(features, np.asarray(reference, np.float64)) < 1e-4


def _image_features(config, variables, pixels):
  tower = models.tower("image", config.model.image, jnp.float32, jnp.float32)
  apply = jax.jit(lambda v, x: tower.apply(v, x, train=False)[0])
  return apply({k: variables[k]["image_tower"] for k in ("params", "batch_stats")}, pixels / 127.5 - 1.0)


def test_tf_reference_and_timm_efficientnets_compute_what_keras_computes(tmp_path):
  """One random EfficientNetB0 in three layouts: Keras' file, the TF reference's checkpoint (whose
  moving averages are taken over the raw values) and timm's tf_efficientnet_b0. All three
  imports hold the same variables, bit for bit, and with ImageNet's input normalisation (the
  reference's and timm's) compute what Keras computes with that normalisation."""
  model = _keras_model("EfficientNetB0", 64)
  randomize_keras(model)
  normalization = next(layer for layer in model.layers if isinstance(layer, keras.layers.Normalization))
  mean, var = [np.asarray(w) for w in normalization.get_weights()[:2]]
  normalization.set_weights([np.array(keras_applications.IMAGENET_MEAN, np.float32).reshape(mean.shape),
                             np.square(keras_applications.IMAGENET_STD).astype(np.float32).reshape(var.shape),
                             normalization.get_weights()[2]])
  write_keras_h5(model, tmp_path / "b0.h5")
  write_tf_reference_efficientnet(model, tmp_path / "reference" / "model.ckpt", "b0", ema_noise=0.5)
  write_timm_efficientnet(model, tmp_path / "timm", "b0")
  pixels = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
  reference = np.asarray(model(pixels, training=False), np.float64)
  imports, towers = {}, {}
  for spec in (f"keras_efficientnet:{tmp_path / 'b0.h5'}", f"tf_efficientnet:{tmp_path / 'reference'}",
               f"timm_efficientnet:{tmp_path / 'timm'}"):
    fmt = spec.split(":")[0]
    config, variables = _import(tmp_path / fmt, image=spec)
    if fmt == "tf_efficientnet":  # The other two hold the same tower and variables (below): the same function.
      assert _relative(_image_features(config, variables, pixels), reference) < 1e-4, fmt
    imports[fmt], towers[fmt] = saved_variables.flat(variables), config.model.image.to_dict()
  for fmt in ("tf_efficientnet", "timm_efficientnet"):
    normalization = ("pixel_mean", "pixel_std")  # Keras' file holds them in float32.
    assert {k: v for k, v in towers[fmt].items() if k not in normalization} == {
        k: v for k, v in towers["keras_efficientnet"].items() if k not in normalization}, fmt
    for key in normalization:
      np.testing.assert_allclose(towers[fmt][key], towers["keras_efficientnet"][key], rtol=1e-6, err_msg=fmt)
    assert imports[fmt].keys() == imports["keras_efficientnet"].keys()
    for name, value in imports["keras_efficientnet"].items():
      np.testing.assert_array_equal(imports[fmt][name], value, err_msg=f"{fmt}: {name}")
  left_out = json.loads((tmp_path / "tf_efficientnet" / "manifest.json").read_text())["towers"]["image"]
  assert left_out["source"]["ema"] == "True"
  assert all(t["source"].endswith("/ExponentialMovingAverage") for t in left_out["tensors"])
  assert any("moving average is imported" in why for why in left_out["not_imported"].values())


def test_timm_resnet_computes_what_keras_hub_computes(tmp_path):
  """timm's resnet50 layout (random weights) against keras-hub's ResNetBackbone, which reads the
  directory through its own timm converter; the input normalisation from timm's config."""
  import keras_hub  # pylint: disable=g-import-not-at-top
  write_timm_resnet(tmp_path / "timm")
  reference = keras_hub.models.ResNetBackbone.from_preset(str(tmp_path / "timm"))
  pixels = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype(np.float32)
  mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
  features = np.asarray(reference((pixels / 255.0 - mean) / std, training=False)).mean(axis=(1, 2))
  config, variables = _import(tmp_path / "imported", image=f"timm_resnet:{tmp_path / 'timm'}")
  assert config.model.image.stride_on == "middle" and config.model.image.padding == "symmetric"
  assert _relative(_image_features(config, variables, pixels), features.astype(np.float64)) < 1e-4


class _KerasShapes:
  """A Keras model's variables by the names its HDF5 file gives them ('stem_conv/kernel'), as
  zeros of their shapes (as KerasH5 reads a file; the numeric tests above read the files)."""

  def __init__(self, model):
    self._shapes = {w.path: tuple(w.shape) for w in model.weights}

  def names(self):
    return self._shapes.keys()

  def get(self, name):
    return np.zeros(self._shapes[name], np.float32)


@pytest.mark.parametrize("name", ["EfficientNetB1", "EfficientNetB2", "EfficientNetB4",
                                  "EfficientNetB5", "EfficientNetB6", "EfficientNetB7",
                                  "ResNet101", "ResNet152"])
def test_every_keras_variant_fits_its_tower(name):
  """Every tensor of keras.applications' model fills the variable of the same shape in the
  tower the importer configures (the variant read off the file), and every variable is filled."""
  with keras.StatelessScope():  # Shapes only: no initial values drawn.
    model = _keras_model(name, 32)
  tower = (keras_applications.resnet_tower if name.startswith("ResNet")
           else keras_applications.efficientnet_tower)(_KerasShapes(model), name)
  shapes, mapped, _ = writer.plan([tower])
  for target, m in mapped.items():
    assert m.load().shape == shapes[target], (m.source, target)
  assert sum(int(np.prod(s)) for s in shapes.values()) == model.count_params() - (
      7 if name.startswith("Eff") else 0)  # Keras' Normalization layer: mean, variance, count.


def test_a_checkpoint_that_does_not_fit_is_one_line(tmp_path, cased_vocab, capsys):
  write_hf_bert(tmp_path / "hf", cased_vocab, lower_case=False)
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=48)))
  assert import_weights.main([f"--text=hf_bert:{tmp_path / 'hf'}", "--max_len=16", f"--out={tmp_path / 'out'}"]) == 1
  error = capsys.readouterr().err.strip()
  assert error.count("\n") == 0
  assert "bert.encoder.layer.0.intermediate.dense.weight" in error and "(32, 64)" in error and "(32, 48)" in error
  assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp*"))
  assert import_weights.main(["--text=pytorch_bin:x", f"--out={tmp_path / 'out'}"]) == 1
  error = capsys.readouterr().err
  assert all(f in error for f in ("hf_bert", "tf_bert", "keras_efficientnet", "keras_resnet"))
  assert import_weights.main([f"--image=hf_bert:{tmp_path / 'hf'}", f"--out={tmp_path / 'out'}"]) == 1
  assert "text tower format" in capsys.readouterr().err
  (tmp_path / "hf" / "model.safetensors").unlink()
  with pytest.raises(CheckpointError, match="no model.safetensors"):
    import_weights.pretrained.read(f"hf_bert:{tmp_path / 'hf'}")


def _user_folder(root, count=12):
  """The converter's folder of a user's TSV (image path, caption, lang): random photos, captions
  in English and German, translation pairs (configs/custom.py reads it)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from mural.data import convert  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  rows = []
  for n in range(count):
    Image.fromarray(rng.integers(0, 255, (40, 48, 3), np.uint8)).save(root / f"{n}.png")
    rows += [f"{root / f'{n}.png'}\tA man in a RED shirt {n}\ten", f"{root / f'{n}.png'}\tEin Mann {n}\tde"]
  (root / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
  folder = root / "mine"
  convert.convert(str(root / "train.tsv"), str(folder), 1, prefix="train")
  (folder / "pairs.tsv").write_text("".join(f"A man {n}\tEin Mann {n}\ten\tde\n" for n in range(count)))
  return folder


def test_the_lit_recipe_starts_at_the_reference_and_keeps_the_locked_tower(tmp_path, cased_vocab):
  """The README's recipe end to end on checkpoints the reference libraries' layouts hold (random
  weights): import a Hugging Face BERT and a Keras EfficientNetB0, take configs/lit.py on a
  converted TSV, export before any step (the text side unheaded, so texts embed as the tower
  does: the reference's [CLS] output), then train: the locked tower ends bit-identical to the
  import, the text tower has moved."""
  from conftest import ROOT, set_fields  # pylint: disable=g-import-not-at-top
  from mural import export  # pylint: disable=g-import-not-at-top
  from mural import train  # pylint: disable=g-import-not-at-top
  from mural import warm_start  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  weights = write_hf_bert(tmp_path / "hf", cased_vocab, lower_case=False, seed=2)
  keras_model = _keras_model("EfficientNetB0", 32)
  randomize_keras(keras_model)
  write_keras_h5(keras_model, tmp_path / "b0.h5")
  imported = tmp_path / "imported"
  _import(imported, text=f"hf_bert:{tmp_path / 'hf'}", image=f"keras_efficientnet:{tmp_path / 'b0.h5'}",
          max_len=16)
  config = config_lib.from_file(f"{ROOT / 'configs' / 'lit.py'}:{_user_folder(tmp_path)},{imported}")
  assert config.model.image.locked and config.model.heads.embed_dim == 1280
  assert config.model.text.hidden_dim == 32 and config.data.text_normalization == "bert_cased"
  set_fields(config, **{  # Toy sizes for the CPU.
      "data.image_size": 32, "data.eval_resize": 36, "tasks.i2t.batch_size": 4, "tasks.t2t.batch_size": 4,
      "total_steps": 3, "optim.warmup_steps": 1, "eval_every_steps": 0, "log_every_steps": 1,
      "data.shuffle_buffer": 16, "model.heads.embed_dim": 32, "model.image.conv_impl": "xla",
      "data.autotune": False,  # Its iterator, collected in a later test, would wait for autotune's tick.
      "tasks.i2t.image_head": "i2t", "tasks.i2t.text_head": ""})
  workdir = str(tmp_path / "run")
  model = export.load(export.export(config, workdir, saved_model=False))  # Untrained: step 0.
  assert json.loads((tmp_path / "run" / "export" / "step_0" / "manifest.json").read_text())["step"] == 0
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  reference = BertWordPieceTokenizer(str(tmp_path / "hf" / "vocab.txt"), lowercase=False)
  reference.enable_truncation(16)
  reference.enable_padding(length=16, pad_id=0)
  encoded = reference.encode_batch(TEXTS)
  cls, _ = _numpy_bert(weights, cfg, np.array([e.ids for e in encoded]),
                       np.array([e.attention_mask for e in encoded]))
  cls /= np.linalg.norm(cls, axis=-1, keepdims=True)
  assert _relative(model.embed_texts(TEXTS), cls) < 1e-4

  # The export holds the variables the run starts from: the trainer's initialisation (heads
  # included), then the warm start.
  setup = train.build(config)
  warm = warm_start.match(setup.abstract_state, config, vocab.wordpiece_path(config, workdir))
  first = setup.init_state(jax.random.PRNGKey(config.seed), warm)
  exported, _ = saved_variables.read_variables(str(tmp_path / "run" / "export" / "step_0"))
  for collection in ("params", "batch_stats"):
    want = saved_variables.flat(getattr(first, collection))
    assert saved_variables.flat(exported[collection]).keys() == want.keys()
    for name, value in saved_variables.flat(exported[collection]).items():
      np.testing.assert_array_equal(value, np.asarray(want[name]), err_msg=f"{collection}/{name}")

  state = train.train_and_evaluate(config, workdir, evaluators=[], setup=setup)["state"]
  start, _ = saved_variables.read_variables(str(imported))
  trained = {c: saved_variables.flat(getattr(state, c)) for c in ("params", "batch_stats")}
  for name, value in saved_variables.flat(start).items():
    collection, rest = name.split("/", 1)
    if rest.startswith("image_tower/"):
      np.testing.assert_array_equal(np.asarray(trained[collection][rest]), value)
  moved = [n for n, v in saved_variables.flat(start["params"]["text_tower"]).items()
           if not np.array_equal(np.asarray(trained["params"][f"text_tower/{n}"]), v)]
  assert moved
