"""The batch engine: many sequences at once (rows joining and leaving, their drafts, chunked prefill, the prefix cache)."""
