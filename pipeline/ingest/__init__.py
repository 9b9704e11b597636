"""The ingest stage: decode a document, chunk it, filter low-information chunks, add context."""
