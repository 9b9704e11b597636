"""Contextual retrieval: a short context situating each chunk within its document, indexed with the chunk.

:mod:`shardfuse.pipeline.ingest.context.prompt` holds the LLM prompt and the answer's post-processing (pure);
:mod:`shardfuse.pipeline.ingest.context.llm` asks an OpenAI-compatible chat model for the contexts (cache, run budget,
backpressure, retries, threads).
"""
