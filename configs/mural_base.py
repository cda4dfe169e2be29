"""MURAL-BASE: EfficientNet-B5 + BERT-Base; image-text and text-text tasks (MURAL 3.1, 3.2, A.1)."""

from mural import systems


def get_config():
  c = systems.base_config("mural")
  c.model.image.variant = "b5"  # MURAL A.1: EfficientNet-B5 image encoder (~30M).
  c.model.image.include_head = False  # ALIGN: global pool of the last MBConv stage, no 1x1 head conv.
  c.model.text.vocab_size = 250_000  # MURAL 3.2: 250k wordpiece vocabulary.
  c.model.text.token_embed_dim = 768  # MURAL A.1: 250k x 768 token table (~192M), not factorised.
  c.model.text.hidden_dim = 768  # MURAL A.1: BERT-Base, 768-d ...
  c.model.text.num_layers = 12  # ... 12 layers ...
  c.model.text.num_heads = 12  # ... 12 attention heads.
  c.model.text.mlp_dim = 3072  # BERT-Base (Devlin et al.): 4 x hidden.
  c.model.heads.embed_dim = 512  # MURAL A.1: FC 768 -> 512 to match the B5 image embedding.
  c.model.heads.kind = "dense"  # MURAL A.1: single FC heads beat MLP heads.
  c.model.init_temperature = 1.0  # MURAL 3.1: i2t temperature learned, initial value 1.0.
  c.tasks.i2t.weight = 1.0  # MURAL A.1: w_t2t : w_i2t = 0.1 : 1.
  c.tasks.i2t.learning_rate = 1e-3  # MURAL 3.2: 1e-3 for the image-text task.
  c.tasks.i2t.batch_size = 4096  # MURAL 3.2: global batch 4096 on 128 TPU v3 cores.
  c.tasks.t2t.weight = 0.1  # MURAL A.1.
  c.tasks.t2t.learning_rate = 1e-4  # MURAL 3.2: 1e-4 for the text-text task.
  c.tasks.t2t.batch_size = 4096  # MURAL 3.2.
  # Fits the paper's 16 GB TPU v3 cores: four micro-batches accumulated with GradCache, so
  # every loss still sees all 4096 examples (same losses and gradients, batch-norm moments
  # of 1024 examples; one extra forward). `--mode=plan --devices=128`: 14.7 GiB per device
  # against 32.3 GiB at 1 (docs/scale.md).
  c.optim.grad_accum_steps = 4
  c.optim.grad_accum_mode = "cached"
  c.tasks.t2t.temperature = 0.01  # MURAL 3.1: fixed temperature for r2l / l2r.
  c.tasks.t2t.margin = 0.3  # MURAL 3.1: additive margin 0.3 (Feng et al. 2020).
  c.data.image_size = 289  # ALIGN (Jia et al. 2021): train on 289 x 289 random crops ...
  c.data.eval_resize = 346  # ... of images resized to 346 (centre crop for eval).
  c.optim.weight_decay = 1e-5  # MURAL 3.2: LAMB (following ALIGN), weight decay ratio 1e-5.
  c.optim.warmup_steps = 10_000  # MURAL 3.2: linear warm-up from zero over 10k steps ...
  c.total_steps = 600_000  # ... and linear decay to zero at 600k steps.
  return c
