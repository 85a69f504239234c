"""Building blocks of the decoder models: the Linear seam, attention over the paged KV cache, norms, rope."""
