"""Triton kernels for the gpt-oss engine (GPU; tested on CPU under TRITON_INTERPRET=1)."""
