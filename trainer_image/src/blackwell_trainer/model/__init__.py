"""The model: the Llama-style decoder, its chunked loss, the document mask, bf16 recast blocks."""
