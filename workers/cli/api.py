"""``shardfuse api`` (the HTTP API in the foreground) and ``shardfuse api-key create | list | revoke`` (its keys)."""

from __future__ import annotations

import argparse
import json
import secrets
from typing import Any

from shardfuse.pipeline.admin.api_keys import key_store
from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.cli import arguments


def register(sub: Any) -> None:
    api = sub.add_parser("api", help="serve the HTTP API (search, upload, delete, status) with zone-scoped keys")
    api.add_argument("--host", help="address to listen on (default: api.host, 127.0.0.1)")
    api.add_argument("--port", type=arguments.port, help="port to listen on (default: api.port, 8080)")
    api.set_defaults(handler=run_api)

    keys = sub.add_parser("api-key", help="create, list and revoke the HTTP API's keys")
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="make a key and print its token (once)")
    create.add_argument("--read", action="append", default=[], metavar="ZONE",
                        help="a zone the key may search and see the status of (repeatable; '*': every zone)")
    create.add_argument("--write", action="append", default=[], metavar="ZONE",
                        help="a zone the key may upload to and delete from (repeatable; '*': every zone)")
    create.add_argument("--name", help="what to call the key (default: key-<random>)")
    create.set_defaults(handler=run_create)
    listing = actions.add_parser("list", help="the keys and their zones (never their tokens)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=run_list)
    revoke = actions.add_parser("revoke", help="remove a key (by name or id); the API refuses it at once")
    revoke.add_argument("key", metavar="NAME_OR_ID")
    revoke.set_defaults(handler=run_revoke)


def run_api(args: argparse.Namespace, settings: Settings) -> int:
    from shardfuse.workers.http.server import serve  # uvicorn and FastAPI: only this command needs them

    serve(settings, host=args.host or settings.api.host, port=args.port or settings.api.port)
    return 0


def run_create(args: argparse.Namespace, settings: Settings) -> int:
    store = key_store(settings)
    key, token = store.create(name=args.name or f"key-{secrets.token_hex(3)}", read=args.read, write=args.write)
    entry = {"name": key.name, "sha256": key.sha256, "read": list(key.read), "write": list(key.write)}
    print(f"created API key {key.name!r} (id {key.key_id}) in {store.path}: "
          f"read {_zones(key.read)}, write {_zones(key.write)}")
    print(f"token (shown only now; send it as 'Authorization: Bearer <token>'):\n{token}")
    print(f"for a deployment without this data dir, add to api.keys (SHARDFUSE_API__KEYS is a JSON list):\n"
          f"{json.dumps(entry)}")
    return 0


def run_list(args: argparse.Namespace, settings: Settings) -> int:
    stored = key_store(settings).load()
    configured = [{"id": entry.sha256[:8], "name": entry.name, "read": list(entry.read), "write": list(entry.write),
                   "source": "settings"} for entry in settings.api.keys]
    rows: list[dict[str, Any]] = [*configured, *(key.public() for key in stored)]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no API keys (`shardfuse api-key create --read ZONE` makes one)")
    for row in rows:
        print(f"{row['id']}  {row['name']:<20} read {_zones(row['read'])}; write {_zones(row['write'])}"
              f"{'  (api.keys)' if row['source'] == 'settings' else ''}")
    return 0


def run_revoke(args: argparse.Namespace, settings: Settings) -> int:
    store = key_store(settings)
    key = store.revoke(args.key)
    print(f"revoked API key {key.name!r} (id {key.key_id}) in {store.path}")
    return 0


def _zones(zones: Any) -> str:
    return ", ".join(zones) if zones else "(none)"
