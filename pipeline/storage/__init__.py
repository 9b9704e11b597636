"""Where document bytes live: the content-addressed store (CAS)."""
