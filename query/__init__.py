"""shardfuse query domain: fan-out to shards, fusion and ranking. Never imports Celery."""
