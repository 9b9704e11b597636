"""LLM query expansion: the prompt, the expander and its cache."""
