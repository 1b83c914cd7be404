"""Which endpoint an input file's records ask for (their ``url``), so the New batch form can preselect it: the one
endpoint they all name when the catalog serves it, else what was found, for the user to choose. Only the guess
is made here; the create still checks every record's ``url`` against the endpoint sent (``url_mismatch``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import ENDPOINTS, Catalog
from ..runtime import Runtime
from ..types import ApiKey, Scope
from ..validation.record_urls import urls_of_records
from .auth import require

__all__ = ["EndpointGuess", "served_endpoints", "guess_endpoint"]

SHOWN_URLS = 5  # distinct urls named back at most; a file naming more is not one batch's input anyway


@dataclass(frozen=True, kw_only=True)
class EndpointGuess:
    chosen: str | None  # the endpoint to preselect: every record names it and a model serves it
    found: tuple[str, ...]  # the distinct urls the records name, the most named first (at most SHOWN_URLS)
    unserved: tuple[str, ...]  # those of ``found`` that no model of the catalog serves

    @property
    def several(self) -> bool:
        return len(self.found) > 1


def served_endpoints(catalog: Catalog) -> tuple[str, ...]:
    """The endpoints some model of the catalog serves, in the API's order: all the form may offer."""
    served = {endpoint for model in catalog.models.values() for endpoint in model.endpoints}
    return tuple(endpoint for endpoint in ENDPOINTS if endpoint in served)


def guess_endpoint(rt: Runtime, key: ApiKey, file_id: str) -> EndpointGuess:
    """The endpoint the records of file ``file_id`` name (404 for another organization's or an unknown file)."""
    require(key, Scope.FILES_READ)
    record = rt.files.get(key.org_id, file_id)
    limits = rt.settings.batches
    with rt.blobs.open(record.blob_key) as handle:
        counts = urls_of_records(handle, max_records=limits.max_records, max_line_bytes=limits.max_line_bytes)
    served = served_endpoints(rt.catalog)
    found = tuple(url for url, _count in counts.most_common(SHOWN_URLS))
    unserved = tuple(url for url in found if url not in served)
    chosen = found[0] if len(counts) == 1 and not unserved else None
    return EndpointGuess(chosen=chosen, found=found, unserved=unserved)
