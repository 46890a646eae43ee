//! Shared building blocks for Berth model-family plugins: weight loading, KV cache, transformer blocks.
