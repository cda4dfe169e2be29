"""ALIGN-BASE: EfficientNet-B5 + BERT-Base, image-text task only (MURAL paper A.1)."""

from mural import config_lib


def get_config():
  c = config_lib.base_config()
  c.model.image.variant = "b5"  # MURAL A.1: EfficientNet-B5 image encoder (~30M).
  c.model.image.include_head = False  # ALIGN: global pool of the last MBConv stage, no 1x1 head conv.
  c.model.text.vocab_size = 250_000  # MURAL 3.2: 250k wordpiece vocabulary.
  c.model.text.token_embed_dim = 768  # MURAL A.1: 250k x 768 token table (~192M), not factorised.
  c.model.text.hidden_dim = 768  # MURAL A.1: BERT-Base, 768-d.
  c.model.text.num_layers = 12  # MURAL A.1: 12 layers.
  c.model.text.num_heads = 12  # MURAL A.1: 12 attention heads.
  c.model.text.mlp_dim = 3072  # BERT-Base (Devlin et al.): 4 x hidden.
  c.model.heads.embed_dim = 512  # MURAL A.1: FC 768 -> 512 to match the B5 image embedding.
  c.model.heads.kind = "dense"  # MURAL A.1: a single FC layer.
  c.model.heads.i2t = True  # MURAL A.1: one FC on the text side.
  c.model.heads.t2t = False  # ALIGN has no text-text task.
  c.loss.t2t_weight = 0.0  # ALIGN: image-text loss only.
  c.loss.init_temperature = 1.0  # MURAL 3.1: learned, initial value 1.0.
  c.data.t2t_sources = []  # ALIGN: no translation pairs.
  c.data.image_size = 289  # ALIGN (Jia et al. 2021): train at 289 x 289 random crops ...
  c.data.eval_resize = 346  # ... of images resized to 346 (centre crop for eval).
  c.optim.name = "lamb"  # MURAL 3.2: LAMB, following ALIGN.
  c.optim.weight_decay = 1e-5  # MURAL 3.2: weight decay ratio 1e-5.
  c.optim.i2t_learning_rate = 1e-3  # MURAL 3.2: 1e-3 for the image-text task.
  c.optim.warmup_steps = 10_000  # MURAL 3.2: linear warm-up from zero over 10k steps.
  c.total_steps = 600_000  # MURAL 3.2: linear decay to zero at 600k steps.
  c.batch_size = 4096  # MURAL 3.2: global batch 4096 on 128 TPU v3 cores.
  return c
