"""Llama-family models: their shape, loading, and conversion between Hugging Face and Megatron layouts."""
