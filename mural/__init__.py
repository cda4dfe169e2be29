"""mural: multilingual image-text dual encoders (MURAL, ALIGN) in JAX/Flax."""
