"""The HTTP API (``shardfuse api``): FastAPI + uvicorn beside the RPC task, with zone-scoped API keys."""
