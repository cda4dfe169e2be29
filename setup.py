"""mural: a JAX/Flax trainer for multilingual image-text dual encoders."""

import setuptools

# Version ranges checked to install and import together on Python 3.11 (CPU).
INSTALL_REQUIRES = [
    "jax>=0.10,<0.11",
    "flax>=0.12,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12,<0.13",
    "ml-collections>=1.1,<2",
    "absl-py>=2.5,<3",
    "tensorflow>=2.21,<2.22",
    "tensorflow-text>=2.21,<2.22",
    "tensorflow-datasets>=4.9,<5",
    "clu>=0.0.12",
    "tensorboard>=2.21,<2.22",  # clu.metric_writers writes TensorBoard event files through it.
    "numpy>=1.26",
    "Pillow>=10.1",
    "faiss-cpu>=1.8,<2",  # mural.index: exact and ANN (HNSW, IVF-PQ) search over embeddings.
    # mural.import_weights: Hugging Face safetensors and Keras HDF5 checkpoints, read tensor by tensor.
    "safetensors>=0.4,<1",
    "h5py>=3.10",
]

setuptools.setup(
    name="mural",
    version="0.1.0",
    description="Multilingual image-text dual encoders (MURAL, ALIGN) in JAX/Flax.",
    packages=setuptools.find_packages(include=["mural", "mural.*"]),
    # C++ sources that mural.kernels compiles on first use.
    package_data={"mural.kernels": ["*.cc"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    # img2dataset: tests write shards with its own writer classes (tests/test_img2dataset.py).
    extras_require={
        # pytest-xdist: `make test` runs on 2 workers (tests/conftest.py groups the tests).
        # tokenizers and keras-hub: the references the checkpoint importers are tested against
        # (no PyTorch: a few MB, CPU only).
        "test": ["pytest>=8", "pytest-xdist>=3.5,<4", "img2dataset>=1.47,<2", "tokenizers>=0.20,<1",
                 "keras-hub>=0.30,<1"],
        # Accelerators: the jax build for them (the CPU jax above is replaced).
        "cuda": ["jax[cuda12]>=0.10,<0.11"],
        "tpu": ["jax[tpu]>=0.10,<0.11"],
    },
    entry_points={"console_scripts": ["mural=mural.main:run"]},
)
