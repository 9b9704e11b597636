"""What operators and client applications run: the publisher, sources, dead letters, reindexing."""
