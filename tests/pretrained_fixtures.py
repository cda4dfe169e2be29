"""Checkpoints in public layouts with random weights, for the importer tests: a Hugging Face
BERT directory (the tensor names and config keys of transformers' BertForPreTraining), Google's
TensorFlow BERT checkpoint of the same weights (written by TensorFlow's checkpoint op, SaveV2), and
keras.applications models with random weights and batch statistics in Keras' HDF5 layout
(written by Keras)."""

import json
import os

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Text in the scripts and cases a multilingual vocabulary meets.
MULTILINGUAL = [
    "Le café est très bon à Paris.", "Příliš žluťoučký kůň úpěl ďábelské ódy",
    "Straße und Grüße, ÄÖÜ", "İstanbul'da ISTANBUL", "我爱北京天安门。", "ねこがすきです",
    "안녕하세요 세계", "مَرْحَبًا بالعالم", "लड़की नमस्ते दुनिया", "Привет, МИР! Ёлка",
    "😀 smile 👍🏽 👨‍👩‍👧 family", "", "  ", "tab\there\nnew\u00a0nbsp\u3000ideo",
    "ctrl\x07char zw\u200bsp soft\u00adhyphen", "A man in a RED shirt is riding a bike.",
    "Ein Mann fährt Fahrrad", "ﬁne Ｆｕｌｌ", "x" * 99, "y" * 101,
]


def bert_vocab(lowercase: bool) -> list:
  """A wordpiece vocabulary learned by `tokenizers`' own trainer from MULTILINGUAL, laid out as
  multilingual BERT's is: [PAD], [unused*], then [UNK], [CLS], [SEP], [MASK] (not mural's ids)."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  trainer = BertWordPieceTokenizer(lowercase=lowercase)
  trainer.train_from_iterator(MULTILINGUAL * 3, vocab_size=200, min_frequency=1,
                              special_tokens=SPECIALS, limit_alphabet=80)
  learned = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
  body = [t for t, _ in learned if t not in SPECIALS]
  return ["[PAD]"] + [f"[unused{i}]" for i in range(1, 6)] + SPECIALS[1:] + body

BERT = dict(vocab_size=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, hidden_act="gelu", max_position_embeddings=40, type_vocab_size=2,
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12,
            model_type="bert", position_embedding_type="absolute", architectures=["BertForPreTraining"])


def bert_weights(cfg: dict, seed: int = 0) -> dict:
  """{Hugging Face name: float32 array} of a random BERT with a masked-LM and next-sentence head."""
  rng = np.random.default_rng(seed)
  h, m, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
  normal = lambda *shape: rng.normal(0, 0.5, shape).astype(np.float32)
  w = {"bert.embeddings.word_embeddings.weight": normal(v, h),
       "bert.embeddings.position_embeddings.weight": normal(cfg["max_position_embeddings"], h),
       "bert.embeddings.token_type_embeddings.weight": normal(cfg["type_vocab_size"], h),
       "bert.embeddings.LayerNorm.weight": 1 + normal(h), "bert.embeddings.LayerNorm.bias": normal(h)}
  for i in range(cfg["num_hidden_layers"]):
    p = f"bert.encoder.layer.{i}."
    for part in ("query", "key", "value"):
      w[f"{p}attention.self.{part}.weight"], w[f"{p}attention.self.{part}.bias"] = normal(h, h), normal(h)
    w[f"{p}attention.output.dense.weight"], w[f"{p}attention.output.dense.bias"] = normal(h, h), normal(h)
    w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"] = 1 + normal(h), normal(h)
    w[f"{p}intermediate.dense.weight"], w[f"{p}intermediate.dense.bias"] = normal(m, h), normal(m)
    w[f"{p}output.dense.weight"], w[f"{p}output.dense.bias"] = normal(h, m), normal(h)
    w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"] = 1 + normal(h), normal(h)
  w["bert.pooler.dense.weight"], w["bert.pooler.dense.bias"] = normal(h, h), normal(h)
  w["cls.predictions.bias"] = normal(v)
  w["cls.predictions.transform.dense.weight"], w["cls.predictions.transform.dense.bias"] = normal(h, h), normal(h)
  w["cls.predictions.transform.LayerNorm.weight"] = 1 + normal(h)
  w["cls.predictions.transform.LayerNorm.bias"] = normal(h)
  w["cls.seq_relationship.weight"], w["cls.seq_relationship.bias"] = normal(2, h), normal(2)
  return w


def write_hf_bert(root, vocab, lower_case: bool, seed: int = 0, **overrides) -> dict:
  """A Hugging Face BERT directory at `root` (model.safetensors, config.json, vocab.txt,
  tokenizer_config.json); returns its weights."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  root.mkdir(parents=True, exist_ok=True)
  cfg = dict(BERT, vocab_size=len(vocab), **overrides)
  weights = bert_weights(cfg, seed)
  save_file(weights, str(root / "model.safetensors"))
  (root / "config.json").write_text(json.dumps(cfg))
  (root / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
  (root / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower_case,
                                                          "tokenizer_class": "BertTokenizer"}))
  return weights


def write_tf_bert(root, weights: dict, vocab) -> None:
  """Google's layout of the same weights: bert_config.json, vocab.txt and bert_model.ckpt with
  TF names ('bert/encoder/layer_0/attention/self/query/kernel', [in, out] kernels)."""
  import re  # pylint: disable=g-import-not-at-top
  root.mkdir(parents=True, exist_ok=True)
  cfg = {k: v for k, v in BERT.items() if k not in ("model_type", "architectures", "position_embedding_type",
                                                      "layer_norm_eps")}
  cfg["vocab_size"] = len(vocab)
  (root / "bert_config.json").write_text(json.dumps(cfg))
  (root / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
  out = {}
  for name, value in weights.items():
    tf_name = re.sub(r"layer\.(\d+)", r"layer_\1", name).replace(".", "/")
    is_norm = "LayerNorm" in tf_name
    if tf_name.endswith("/weight"):
      if is_norm:
        tf_name = tf_name.removesuffix("/weight") + "/gamma"
      elif "embeddings" in tf_name:
        tf_name = tf_name.removesuffix("/weight")
      else:
        tf_name, value = tf_name.removesuffix("/weight") + "/kernel", value.T
    elif tf_name.endswith("/bias") and is_norm:
      tf_name = tf_name.removesuffix("/bias") + "/beta"
    if tf_name == "cls/seq_relationship/kernel":
      tf_name, value = "cls/seq_relationship/output_weights", value.T
    out[tf_name] = value
  save_tf_checkpoint(out, root / "bert_model.ckpt")


def save_tf_checkpoint(arrays: dict, prefix) -> None:
  """A TF1 name-based checkpoint of {name: array} plus a global step, as TensorFlow's Saver writes
  one: its SaveV2 op (the one Saver.save runs) and the directory's `checkpoint` state file. Eager
  and in one op: a graph of 600 variables and their assigns took TensorFlow 40 s to build."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  names = [*arrays, "global_step"]
  tensors = [tf.constant(np.ascontiguousarray(arrays[n])) for n in arrays] + [tf.constant(0, tf.int64)]
  tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
  tf.compat.v1.train.update_checkpoint_state(os.path.dirname(str(prefix)), str(prefix))


def randomize_keras(model, seed: int = 0) -> None:
  """Random weights, batch-norm statistics and input normalisation (He-scaled kernels, so the
  activations keep their size through the depth)."""
  rng = np.random.default_rng(seed)
  for layer in model.layers:
    values = []
    for w, v in zip(layer.get_weights(), layer.weights):
      name = v.path.rsplit("/", 1)[-1]
      if name in ("moving_variance", "variance", "gamma"):
        values.append(rng.uniform(0.5, 1.5, w.shape))
      elif name == "count":
        values.append(w)
      elif name in ("moving_mean", "mean", "beta", "bias"):
        values.append(rng.normal(0, 0.1, w.shape))
      else:
        values.append(rng.normal(0, 1, w.shape) * np.sqrt(2.0 / np.prod(w.shape[:-1])))
    if values:
      layer.set_weights([np.asarray(x, np.float32) for x in values])


def write_keras_h5(model, path) -> None:
  """model's weights in the HDF5 layout keras.applications' files have (Keras' own writer)."""
  import h5py  # pylint: disable=g-import-not-at-top
  from keras.src.legacy.saving import legacy_h5_format  # pylint: disable=g-import-not-at-top
  with h5py.File(str(path), "w") as f:
    legacy_h5_format.save_weights_to_hdf5_group(f, model)


def _keras_blocks(model):
  """[(keras block prefix 'block2a_', global index, has an expand conv)] in order."""
  import re  # pylint: disable=g-import-not-at-top
  prefixes = sorted({m.group(1) for w in model.weights for m in [re.match(r"(block\d[a-z]_)", w.path)] if m},
                    key=lambda p: (int(p[5]), p[6]))
  names = {w.path for w in model.weights}
  return [(p, i, f"{p}expand_conv/kernel" in names) for i, p in enumerate(prefixes)]


def _keras_bn(weights, layer):
  return [weights[f"{layer}/{k}"] for k in ("gamma", "beta", "moving_mean", "moving_variance")]


def write_tf_reference_efficientnet(model, prefix, variant: str, ema_noise: float = 0.0) -> None:
  """The Keras EfficientNet's weights as the TF reference (tensorflow/tpu efficientnet_model.py)
  names them in a checkpoint: 'efficientnet-b0/blocks_1/conv2d/kernel', ... (a block's convs and
  norms numbered in the order it calls them). With ema_noise > 0 every variable also has an
  '/ExponentialMovingAverage' holding the weights, and the raw variable holds them plus noise:
  what the reference evaluates with is the average."""
  weights = {w.path: np.asarray(w.numpy()) for w in model.weights}
  scope = f"efficientnet-{variant}"
  out = {f"{scope}/stem/conv2d/kernel": weights["stem_conv/kernel"]}
  bn_keys = ("gamma", "beta", "moving_mean", "moving_variance")
  add_bn = lambda name, values: out.update({f"{name}/{k}": v for k, v in zip(bn_keys, values)})
  add_bn(f"{scope}/stem/tpu_batch_normalization", _keras_bn(weights, "stem_bn"))
  for p, i, expand in _keras_blocks(model):
    k = f"{scope}/blocks_{i}"
    convs, norms = iter(["conv2d", "conv2d_1"]), iter(["tpu_batch_normalization", "tpu_batch_normalization_1",
                                                       "tpu_batch_normalization_2"])
    if expand:
      out[f"{k}/{next(convs)}/kernel"] = weights[f"{p}expand_conv/kernel"]
      add_bn(f"{k}/{next(norms)}", _keras_bn(weights, f"{p}expand_bn"))
    out[f"{k}/depthwise_conv2d/depthwise_kernel"] = weights[f"{p}dwconv/kernel"]
    add_bn(f"{k}/{next(norms)}", _keras_bn(weights, f"{p}bn"))
    for ours, theirs in (("se_reduce", "se/conv2d"), ("se_expand", "se/conv2d_1")):
      out[f"{k}/{theirs}/kernel"], out[f"{k}/{theirs}/bias"] = weights[f"{p}{ours}/kernel"], weights[f"{p}{ours}/bias"]
    out[f"{k}/{next(convs)}/kernel"] = weights[f"{p}project_conv/kernel"]
    add_bn(f"{k}/{next(norms)}", _keras_bn(weights, f"{p}project_bn"))
  out[f"{scope}/head/conv2d/kernel"] = weights["top_conv/kernel"]
  add_bn(f"{scope}/head/tpu_batch_normalization", _keras_bn(weights, "top_bn"))
  out[f"{scope}/head/dense/kernel"] = np.zeros((out[f"{scope}/head/conv2d/kernel"].shape[-1], 10), np.float32)
  if ema_noise:
    rng = np.random.default_rng(1)
    out = dict({f"{n}/ExponentialMovingAverage": v for n, v in out.items()},
               **{n: v + rng.normal(0, ema_noise, v.shape).astype(v.dtype) for n, v in out.items()})
  save_tf_checkpoint(out, prefix)


def write_timm_efficientnet(model, root, variant: str) -> None:
  """The Keras EfficientNet's weights as timm's tf_efficientnet_<variant> names and lays them
  out (PyTorch's [out, in, kh, kw] convs), with timm's config.json."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  weights = {w.path: np.asarray(w.numpy()) for w in model.weights}
  oihw = lambda x: np.ascontiguousarray(x.transpose(3, 2, 0, 1))
  out = {"conv_stem.weight": oihw(weights["stem_conv/kernel"])}
  bn = lambda name, layer: out.update({f"{name}.{k}": v for k, v in zip(
      ("weight", "bias", "running_mean", "running_var"), _keras_bn(weights, layer))})
  bn("bn1", "stem_bn")
  stage_of, count = {}, {}
  for p, _, expand in _keras_blocks(model):
    s = int(p[5]) - 1
    r = count[s] = count.get(s, -1) + 1
    k = f"blocks.{s}.{r}"
    if expand:
      out[f"{k}.conv_pw.weight"] = oihw(weights[f"{p}expand_conv/kernel"])
      bn(f"{k}.bn1", f"{p}expand_bn")
      dw_bn, project, project_bn = f"{k}.bn2", f"{k}.conv_pwl.weight", f"{k}.bn3"
    else:
      dw_bn, project, project_bn = f"{k}.bn1", f"{k}.conv_pw.weight", f"{k}.bn2"
    out[f"{k}.conv_dw.weight"] = np.ascontiguousarray(weights[f"{p}dwconv/kernel"].transpose(2, 3, 0, 1))
    bn(dw_bn, f"{p}bn")
    for ours, theirs in (("se_reduce", "se.conv_reduce"), ("se_expand", "se.conv_expand")):
      out[f"{k}.{theirs}.weight"], out[f"{k}.{theirs}.bias"] = oihw(weights[f"{p}{ours}/kernel"]), weights[f"{p}{ours}/bias"]
    out[project] = oihw(weights[f"{p}project_conv/kernel"])
    bn(project_bn, f"{p}project_bn")
    stage_of[p] = s
  out["conv_head.weight"] = oihw(weights["top_conv/kernel"])
  bn("bn2", "top_bn")
  out["classifier.weight"] = np.zeros((10, out["conv_head.weight"].shape[0]), np.float32)
  out["bn1.num_batches_tracked"] = np.zeros((), np.int64)
  root.mkdir(parents=True, exist_ok=True)
  save_file({n: np.ascontiguousarray(v) for n, v in out.items()}, str(root / "model.safetensors"))
  (root / "config.json").write_text(json.dumps({"architecture": f"tf_efficientnet_{variant}", "num_classes": 10}))


def write_timm_resnet(root, depth: int = 50, seed: int = 0) -> None:
  """Random weights and batch statistics in timm's resnet<depth> layout (torchvision's names,
  [out, in, kh, kw] convs), with timm's config.json."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  out = {}

  def conv(name, cout, cin, k):
    out[f"{name}.weight"] = (rng.normal(0, 1, (cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)

  def bn(name, c):
    out.update({f"{name}.weight": rng.uniform(0.5, 1.5, c), f"{name}.bias": rng.normal(0, 0.1, c),
                f"{name}.running_mean": rng.normal(0, 0.1, c), f"{name}.running_var": rng.uniform(0.5, 1.5, c),
                f"{name}.num_batches_tracked": np.zeros((), np.int64)})

  conv("conv1", 64, 3, 7)
  bn("bn1", 64)
  blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
  cin = 64
  for s, count in enumerate(blocks):
    width = 64 * 2**s
    for b in range(count):
      k = f"layer{s + 1}.{b}"
      conv(f"{k}.conv1", width, cin, 1), bn(f"{k}.bn1", width)
      conv(f"{k}.conv2", width, width, 3), bn(f"{k}.bn2", width)
      conv(f"{k}.conv3", 4 * width, width, 1), bn(f"{k}.bn3", 4 * width)
      if b == 0:
        conv(f"{k}.downsample.0", 4 * width, cin, 1), bn(f"{k}.downsample.1", 4 * width)
      cin = 4 * width
  out["fc.weight"], out["fc.bias"] = np.zeros((10, cin), np.float32), np.zeros(10, np.float32)
  root.mkdir(parents=True, exist_ok=True)
  save_file({n: np.ascontiguousarray(v, np.float32 if v.dtype == np.float64 else v.dtype) for n, v in out.items()},
            str(root / "model.safetensors"))
  (root / "config.json").write_text(json.dumps({
      "architecture": f"resnet{depth}", "num_classes": 10,
      "pretrained_cfg": {"input_size": [3, 224, 224], "interpolation": "bicubic",
                         "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}))
