"""BERT-family checkpoints -> mural's BERT text tower (mural/models/bert.py).

Two formats with one name table: Hugging Face directories (`config.json`, `model.safetensors`,
`vocab.txt`, `tokenizer_config.json`: bert-base-multilingual-cased, LaBSE, bert-base-uncased,
...) and Google's original TensorFlow checkpoints (`bert_config.json`, `bert_model.ckpt.*`,
`vocab.txt`: multi_cased_L-12_H-768_A-12, ...). The token-type table and the pooler are mapped
(model.text.type_vocab_size, model.text.pooler); the position table keeps its first
`max_len` rows (the tokenizer's length; longer inputs are cut there anyway); the pre-training
heads (masked LM, next sentence) and optimizer slots are listed in the manifest as not used.
"""

import re
from typing import Optional

import numpy as np
from etils import epath

from mural.pretrained.source import CheckpointError, Mapped, read_json, Safetensors, TfCheckpoint, Tower


# (mural name, TF BERT name, kind) of one encoder layer's parameters, under layer_<i>/ and
# encoder/layer_<i>/; kind says how the tensor's layout changes (_reshape).
_LAYER = tuple(
    [(f"attention/{p}/kernel", f"attention/self/{p}/kernel", "heads_out") for p in ("query", "key", "value")]
    + [(f"attention/{p}/bias", f"attention/self/{p}/bias", "heads_bias") for p in ("query", "key", "value")]
    + [("attention/out/kernel", "attention/output/dense/kernel", "heads_in"),
       ("attention/out/bias", "attention/output/dense/bias", "")]
    + [(f"{ours}/{w}", f"{theirs}/{w}", "kernel" if w == "kernel" else "")
       for ours, theirs in (("mlp_in", "intermediate/dense"), ("mlp_out", "output/dense")) for w in ("kernel", "bias")]
    + [(f"{ours}/{mine}", f"{theirs}/LayerNorm/{tf}", "")
       for ours, theirs in (("attention_norm", "attention/output"), ("mlp_norm", "output"))
       for mine, tf in (("scale", "gamma"), ("bias", "beta"))])


def _names(num_layers: int):
  """(mural name under text_tower, TF BERT name under 'bert/', kind) for every parameter."""
  yield "token_embed/embedding", "embeddings/word_embeddings", "table"
  yield "position_embed", "embeddings/position_embeddings", "rows"
  yield "token_type_embed", "embeddings/token_type_embeddings", "table"
  yield "embed_norm/scale", "embeddings/LayerNorm/gamma", ""
  yield "embed_norm/bias", "embeddings/LayerNorm/beta", ""
  for i in range(num_layers):
    for ours, theirs, kind in _LAYER:
      yield f"layer_{i}/{ours}", f"encoder/layer_{i}/{theirs}", kind
  yield "pooler/kernel", "pooler/dense/kernel", "kernel"
  yield "pooler/bias", "pooler/dense/bias", ""


def _hf_name(tf_name: str, kind: str) -> tuple:
  """(the Hugging Face name, its alternative for a LayerNorm: 'weight'/'bias' or the older
  'gamma'/'beta') of a TF BERT name."""
  name = re.sub(r"layer_(\d+)", r"layer.\1", tf_name).replace("/", ".")
  if kind == "table" or kind == "rows":
    return name + ".weight", None
  if name.endswith(".kernel"):
    return name.removesuffix(".kernel") + ".weight", None
  if name.endswith(".gamma"):
    return name.removesuffix(".gamma") + ".weight", name
  if name.endswith(".beta"):
    return name.removesuffix(".beta") + ".bias", name
  return name, None


def _reshape(x: np.ndarray, kind: str, heads: int, max_len: int, transposed: bool) -> np.ndarray:
  """A source tensor in mural's layout; `transposed`: a [out, in] PyTorch Linear weight."""
  if transposed and kind in ("heads_out", "heads_in", "kernel"):
    x = x.T
  if kind == "heads_out":  # [H, H] -> [H, heads, head_dim]
    return x.reshape(x.shape[0], heads, -1)
  if kind == "heads_bias":
    return x.reshape(heads, -1)
  if kind == "heads_in":  # [H, H] -> [heads, head_dim, H]
    return x.reshape(heads, -1, x.shape[1])
  if kind == "rows":
    return x[:max_len]
  return x


_TRANSFORMS = {"heads_out": "reshape [in, heads, head_dim]", "heads_bias": "reshape [heads, head_dim]",
               "heads_in": "reshape [heads, head_dim, out]", "rows": "first max_len rows",
               "kernel": "", "table": "", "": ""}


# hidden_act -> GELU's tanh approximation or not, as each library computes the name: Google's
# BERT code computes 'gelu' with tanh, transformers with erf ('gelu_new': tanh).
_GELU = {"tf_bert": {"gelu": True},
         "hf_bert": {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}}


def _fields(cfg: dict, max_len: int, pooler: bool, where: str, fmt: str) -> dict:
  """config.model.text of a BERT config (HF's config.json and TF's bert_config.json share keys);
  an architecture mural's tower does not compute is one line."""
  keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "max_position_embeddings")
  absent = [k for k in keys if not isinstance(cfg.get(k), int)]
  if absent:
    raise CheckpointError(f"{where}: no integer {', '.join(absent)} (a BERT config has {', '.join(keys)})")

  def need(key, allowed):
    value = cfg.get(key, allowed[0])
    if value not in allowed:
      raise CheckpointError(f"{where}: {key} {value!r} is not what mural's BERT computes ({allowed})")
  need("hidden_act", tuple(_GELU[fmt]))
  need("position_embedding_type", ("absolute",))
  eps = cfg.get("layer_norm_eps", 1e-12)
  if abs(eps - 1e-12) > 1e-15:
    raise CheckpointError(f"{where}: layer_norm_eps {eps} (mural's BERT uses 1e-12)")
  if cfg.get("embedding_size", cfg["hidden_size"]) != cfg["hidden_size"]:
    raise CheckpointError(f"{where}: embedding_size {cfg['embedding_size']} differs from hidden_size "
                          f"{cfg['hidden_size']} (an ALBERT-style table, not a BERT one)")
  if max_len > cfg["max_position_embeddings"]:
    raise CheckpointError(f"{where}: max_len {max_len} exceeds its {cfg['max_position_embeddings']} positions")
  return dict(name="bert", vocab_size=cfg["vocab_size"], token_embed_dim=cfg["hidden_size"],
              hidden_dim=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
              num_heads=cfg["num_attention_heads"], mlp_dim=cfg["intermediate_size"], max_len=max_len,
              dropout_rate=cfg.get("hidden_dropout_prob", 0.1),
              type_vocab_size=cfg.get("type_vocab_size", 2), pooler=pooler,
              gelu_approximate=_GELU[fmt][cfg.get("hidden_act", "gelu")])


def _tower(fields, reader, name_of, transposed, vocab, lower_case, source, pooler_note):
  heads, max_len = fields["num_heads"], fields["max_len"]
  have = set(reader.names())
  tensors, used = [], set()
  for ours, tf_name, kind in _names(fields["num_layers"]):
    if ours.startswith("pooler/") and not fields["pooler"]:
      continue
    theirs = name_of(tf_name, kind, have)
    if theirs is None:
      raise CheckpointError(f"{source['path']}: no tensor for text_tower/{ours} (looked for "
                            f"{name_of(tf_name, kind, None)})")
    used.add(theirs)
    load = (lambda n=theirs, k=kind: _reshape(reader.get(n), k, heads, max_len, transposed))
    how = ("transpose; " if transposed and kind in ("heads_out", "heads_in", "kernel") else "") + _TRANSFORMS[kind]
    tensors.append(Mapped(f"params/text_tower/{ours}", theirs, how.strip("; "), load))
  unused = {}
  for name in sorted(have - used):
    if "pooler" in name:
      unused[name] = pooler_note
    elif re.search(r"adam_[mv]|global_step|_slot_|optimizer", name):
      unused[name] = "optimizer state"
    else:
      unused[name] = "not part of the encoder (a pre-training head)"
  data = dict(text_normalization="bert_uncased" if lower_case else "bert_cased")
  return Tower("text", fields, data, vocab, tensors, unused, source)


def _need_vocab(root, layout: str) -> None:
  if not (root / "vocab.txt").exists():
    raise CheckpointError(f"{root}: no vocab.txt ({layout})")


_POOLER_NOTE = "the pooler: not used by a [CLS] embedding (import with pooler=True to embed through it)"


def read_hf(path: str, max_len: int = 64, pooler: bool = False,
            lower_case: Optional[bool] = None) -> Tower:
  """A Hugging Face BERT directory. Casing: `lower_case`, else tokenizer_config.json's
  do_lower_case (True where it is absent, as transformers' BertTokenizer defaults)."""
  root = epath.Path(path)
  layout = "a Hugging Face BERT directory has config.json, model.safetensors, vocab.txt"
  _need_vocab(root, layout)
  cfg = read_json(root / "config.json", layout)
  if cfg.get("model_type", "bert") != "bert":
    raise CheckpointError(f"{path}/config.json: model_type {cfg.get('model_type')!r}, not 'bert'")
  if lower_case is None:
    tok_cfg = root / "tokenizer_config.json"
    tok = read_json(tok_cfg, layout, required=False)
    lower_case = bool(tok.get("do_lower_case", True))
    strip = tok.get("strip_accents")
    if strip is not None and strip != lower_case:
      raise CheckpointError(f"{tok_cfg}: strip_accents={strip} with do_lower_case={lower_case}: "
                            "mural's tokenizer strips accents exactly when it lower-cases")
  reader = Safetensors(path)

  def name_of(tf_name, kind, have):
    first, alternative = _hf_name(tf_name, kind)
    options = [p + n for n in (first, alternative) if n for p in ("", "bert.")]
    if have is None:
      return " or ".join(options)
    return next((n for n in options if n in have), None)

  fields = _fields(cfg, max_len, pooler, f"{path}/config.json", "hf_bert")
  return _tower(fields, reader, name_of, True, str(root / "vocab.txt"), lower_case,
                {"format": "hf_bert", "path": str(path)}, _POOLER_NOTE)


def read_tf(path: str, max_len: int = 64, pooler: bool = False,
            lower_case: Optional[bool] = None) -> Tower:
  """Google's TensorFlow BERT directory. Its files do not say the casing: `lower_case`, else
  'uncased' in the directory's name (as Google names them: uncased_L-12_H-768_A-12)."""
  root = epath.Path(path)
  layout = "a TensorFlow BERT directory has bert_config.json, bert_model.ckpt.*, vocab.txt"
  _need_vocab(root, layout)
  cfg = read_json(root / "bert_config.json", layout)
  prefix = root / "bert_model.ckpt"
  reader = TfCheckpoint(str(prefix) if epath.Path(str(prefix) + ".index").exists() else path)
  if lower_case is None:
    lower_case = "uncased" in root.name.lower()

  def name_of(tf_name, kind, have):
    full = "bert/" + tf_name
    return full if have is None or full in have else None

  fields = _fields(cfg, max_len, pooler, f"{path}/bert_config.json", "tf_bert")
  return _tower(fields, reader, name_of, False, str(root / "vocab.txt"), lower_case,
                {"format": "tf_bert", "path": str(path)}, _POOLER_NOTE)
