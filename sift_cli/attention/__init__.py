"""Attention backends behind one interface (`base.py`): `reference` (the ground truth, plain PyTorch), `flex`
(FlexAttention), `cuda` (the bundled Hopper kernels); `backends.get_backend` picks one; `integration` runs a
Hugging Face model with one of them in every layer; `swap` swaps a model's attention function."""
