"""Fused Triton kernels for the gpt-oss engine, one op per file, each with its launcher."""
