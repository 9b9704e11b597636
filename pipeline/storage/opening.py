"""Settings → a :class:`~shardfuse.pipeline.storage.cas.ContentStore`: the one place that chooses the adapter.

``cas.url`` decides (:mod:`shardfuse.pipeline.config.cas_location`): empty, the folder ``cas.root`` under
``data_dir`` (the embedded default); ``file:///path``, that folder; ``s3://bucket/prefix``, the object store
``[cas.s3]`` describes. Opening touches nothing (no folder is created, no request sent): a store that is
out of reach fails on first use, with our errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardfuse.pipeline.config.cas_location import FileLocation, S3Location
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.storage.cas import ContentStore, LocalContentStore

if TYPE_CHECKING:
    from shardfuse.pipeline.storage.s3_store import S3ContentStore


def open_content_store(settings: Settings) -> ContentStore:
    """The CAS ``settings.cas`` names."""
    location = settings.cas.location
    if isinstance(location, S3Location):
        return open_s3_store(settings)
    if isinstance(location, FileLocation):
        return LocalContentStore(location.root)
    return LocalContentStore(settings.cas_root)


def open_s3_store(settings: Settings) -> S3ContentStore:
    """The S3 adapter for an ``s3://`` ``cas.url`` (for callers that need its extras, such as
    ``ensure_bucket``); ConfigurationError if ``cas.url`` is not one."""
    # Imported here: boto3 takes a while to import, and only deployments with an s3:// CAS need it.
    from shardfuse.pipeline.storage.s3_store import S3ContentStore

    location = settings.cas.location
    if not isinstance(location, S3Location):
        raise ConfigurationError(f"cas.url {settings.cas.url!r} is not an s3:// URL")
    return S3ContentStore(location=location, settings=settings.cas.s3)
