"""The embed stage: cross-document batches, embedding providers, and the limits that share a quota."""
