"""MURAL-LARGE: EfficientNet-B7 + BERT-Large with a factorised token table (MURAL A.1)."""

from mural import config_lib


def get_config():
  c = config_lib.base_config()
  c.model.image.variant = "b7"  # MURAL A.1: EfficientNet-B7 image encoder (~66M).
  c.model.image.include_head = False  # ALIGN: global pool of the last MBConv stage, no 1x1 head conv.
  c.model.text.vocab_size = 250_000  # MURAL 3.2: 250k wordpiece vocabulary.
  c.model.text.token_embed_dim = 256  # MURAL A.1: 256-d token embeddings (~64M) ...
  c.model.text.hidden_dim = 1024  # ... projected to BERT-Large's 1024 hidden size.
  c.model.text.num_layers = 24  # MURAL A.1 fn. 8: 24 layers.
  # MURAL A.1 fn. 8 says 24 heads, but 24 does not divide 1024; BERT-Large
  # (Devlin et al.) has 16 heads of 64. The head count leaves the size unchanged.
  c.model.text.num_heads = 16
  c.model.text.mlp_dim = 4096  # BERT-Large (Devlin et al.): 4 x hidden.
  c.model.heads.embed_dim = 640  # MURAL A.1 / systems digest: B7 pools to 640-d; heads match it.
  c.model.heads.kind = "dense"  # MURAL A.1: single FC heads beat MLP heads.
  c.model.heads.i2t = True  # MURAL 3.1: one head for the image-text task ...
  c.model.heads.t2t = True  # ... and one for the text-text task.
  c.loss.i2t_weight = 1.0  # MURAL A.1: w_t2t : w_i2t = 0.1 : 1.
  c.loss.t2t_weight = 0.1  # MURAL A.1: w_t2t : w_i2t = 0.1 : 1.
  c.loss.init_temperature = 1.0  # MURAL 3.1: i2t temperature learned, initial value 1.0.
  c.loss.t2t_temperature = 0.01  # MURAL 3.1: fixed temperature 0.01 for r2l / l2r.
  c.loss.t2t_margin = 0.3  # MURAL 3.1: additive margin 0.3 (Feng et al. 2020).
  c.data.image_size = 289  # ALIGN (Jia et al. 2021): train on 289 x 289 random crops ...
  c.data.eval_resize = 346  # ... of images resized to 346 (centre crop for eval).
  c.optim.name = "lamb"  # MURAL 3.2: LAMB, following ALIGN.
  c.optim.weight_decay = 1e-5  # MURAL 3.2: weight decay ratio 1e-5.
  c.optim.i2t_learning_rate = 1e-3  # MURAL 3.2: 1e-3 for the image-text task.
  c.optim.t2t_learning_rate = 1e-4  # MURAL 3.2: 1e-4 for the text-text task.
  c.optim.warmup_steps = 10_000  # MURAL 3.2: linear warm-up from zero over 10k steps.
  c.total_steps = 600_000  # MURAL 3.2: linear decay to zero at 600k steps.
  # MURAL 3.2: 512 cores and "4x larger samples"; the per-core batch is not
  # stated, so the BASE batch is kept.
  c.batch_size = 4096
  c.t2t_batch_size = 4096  # As batch_size.
  return c
