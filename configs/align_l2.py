"""ALIGN-L2: EfficientNet-L2 + BERT-Large, image-text only (MURAL 3.2, A.1)."""

from mural import config_lib


def get_config():
  c = config_lib.base_config()
  c.model.image.variant = "l2"  # MURAL A.1: EfficientNet-L2 image encoder (~480M).
  c.model.image.include_head = False  # ALIGN: global pool of the last MBConv stage, no 1x1 head conv.
  c.model.text.vocab_size = 250_000  # MURAL 3.2: 250k wordpiece vocabulary.
  c.model.text.token_embed_dim = 256  # MURAL A.1: 64M token embeddings, i.e. 250k x 256 ...
  c.model.text.hidden_dim = 1024  # ... projected to BERT-Large's 1024 hidden size.
  c.model.text.num_layers = 24  # MURAL A.1: BERT-Large, 24 layers.
  # MURAL A.1 fn. 8 says 24 heads, but 24 does not divide 1024; BERT-Large
  # (Devlin et al.) has 16 heads of 64. The head count leaves the size unchanged.
  c.model.text.num_heads = 16
  c.model.text.mlp_dim = 4096  # BERT-Large (Devlin et al.): 4 x hidden.
  c.model.heads.embed_dim = 1376  # L2 pools to round_filters(320, 4.3) = 1376-d; the head matches it.
  c.model.heads.kind = "dense"  # MURAL A.1: one FC on the text side.
  c.model.heads.i2t = True  # MURAL A.1: one FC on the text side.
  c.model.heads.t2t = False  # ALIGN has no text-text task.
  c.loss.t2t_weight = 0.0  # ALIGN: image-text loss only.
  c.loss.init_temperature = 1.0  # MURAL 3.1: learned, initial value 1.0.
  c.data.t2t_sources = []  # ALIGN: no translation pairs.
  c.data.image_size = 289  # ALIGN (Jia et al. 2021): train on 289 x 289 random crops ...
  c.data.eval_resize = 346  # ... of images resized to 346 (centre crop for eval).
  c.optim.name = "lamb"  # MURAL 3.2: LAMB, following ALIGN.
  c.optim.weight_decay = 1e-5  # MURAL 3.2: weight decay ratio 1e-5.
  c.optim.i2t_learning_rate = 1e-3  # MURAL 3.2: 1e-3 for the image-text task.
  c.optim.warmup_steps = 10_000  # MURAL 3.2: linear warm-up from zero over 10k steps.
  c.total_steps = 600_000  # MURAL 3.2: the BASE schedule (ALIGN-L2's own run is not replicated).
  c.batch_size = 4096  # MURAL 3.2: global batch 4096.
  return c
