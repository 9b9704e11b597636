"""Keeping secrets out of what people and logs see.

The secrets of a deployment are the passwords inside ``broker.url``, ``broker.result_backend``,
``postgres.dsn`` and ``postgres.shard_dsns``, the embedder's and the chat models' API keys, the Flower
password and the object store's secret key. URLs and DSNs are shown with their password replaced by
:data:`MASK` (the user name, host, port and database stay: they are what an operator needs to see).
:func:`secret_values` lists every secret of a settings object, for scrubbing free text and for tests that
look for leaks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import psycopg.conninfo

MASK = "***"

# scheme://[user[:password]@]host...: the authority runs to the first '/', and the host starts after its
# last '@' (as urllib parses it), so a password written with an unencoded '@', '?' or '#' is masked whole.
_URL = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<authority>[^/]*)(?P<tail>.*)$", re.DOTALL)
# A libpq URI's query may carry the password too: ?password=... or &password=...
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&]password=)[^&#]*", re.IGNORECASE)
# kombu's failover list separator: a ';' followed by another URL (a ';' inside a password is not one).
_FAILOVER = re.compile(r";(?=[A-Za-z][A-Za-z0-9+.\-]*://)")


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo (and a ``password=`` query parameter) masked.

    ``redis://:s3cret@127.0.0.1:6379/0`` → ``redis://:***@127.0.0.1:6379/0``; a URL without a password is
    returned unchanged. kombu's failover lists (``url1;url2``) are masked URL by URL.
    """
    parts = _FAILOVER.split(url)
    if len(parts) > 1:
        return ";".join(redact_url(part) for part in parts)
    match = _URL.match(url)
    if match is not None:
        userinfo, at, host = match["authority"].rpartition("@")
        if at and ":" in userinfo:
            url = f"{match['head']}{userinfo.split(':', 1)[0]}:{MASK}@{host}{match['tail']}"
    return _QUERY_PASSWORD.sub(lambda m: m["key"] + MASK, url)


def url_problem(url: str) -> str | None:
    """Why ``url`` (or a part of a kombu failover list) cannot be connected to, as far as its form says: a
    port that is not a number from 0 to 65535; None if its form is fine. The URL is shown masked."""
    for part in _FAILOVER.split(url):
        try:
            _ = urlsplit(part).port  # reading it is the check: urllib parses the port only then
        except ValueError as exc:
            return f"{redact_url(part)}: {exc}"
    return None


def redact_dsn(dsn: str) -> str:
    """A libpq connection string (URI or ``key=value`` form) with its password masked."""
    if "://" in dsn.split("?", 1)[0] or dsn.startswith(("postgres:", "postgresql:")):
        return redact_url(dsn)
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # Unparseable: show nothing of it rather than risk showing its password.
        return "<unparseable connection string>"
    if "password" not in params:
        return dsn
    params["password"] = MASK
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in params.items() if v is not None})


def url_password(url: str) -> str | None:
    """The (percent-decoded) password of a URL's userinfo, or None."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password else None


def dsn_password(dsn: str) -> str | None:
    """The password a libpq connection string carries (URI userinfo, query or ``password=``), or None."""
    try:
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return None
    return str(password) if password else None


def secret_values(settings: Any) -> list[str]:
    """Every non-empty secret of a :class:`~shardfuse.pipeline.config.settings.Settings`, as plain text.

    Duck-typed (no import of the settings module, which uses this one for its repr).
    """
    found = [
        url_password(settings.broker.url),
        url_password(settings.broker.result_backend),
        dsn_password(settings.postgres.dsn),
        *(dsn_password(dsn) for dsn in settings.postgres.shard_dsns),
        settings.embedder.api_key.get_secret_value(),
        settings.context.api_key.get_secret_value(),
        settings.query.expansion.api_key.get_secret_value(),
        settings.rerank.api_key.get_secret_value(),
        settings.flower.password.get_secret_value(),
        settings.cas.s3.secret_access_key.get_secret_value(),
    ]
    return list(dict.fromkeys(value for value in found if value))


def spellings(secret: str) -> set[str]:
    """The ways ``secret`` can be written down: as is, and percent-encoded as in a URL."""
    return {secret, quote(secret, safe=""), quote(secret, safe="!$&'()*+,;=~")}


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every spelling of every secret in ``secrets`` replaced by :data:`MASK`."""
    # Longest first, so that a secret containing another is masked whole.
    for spelling in sorted({s for secret in secrets if secret for s in spellings(secret)}, key=len, reverse=True):
        text = text.replace(spelling, MASK)
    return text
