"""Which endpoint `orl batches create` creates for, settled before anything is uploaded: the one given, else the one
every record's ``url`` names; either must be served by a model of the catalog (GET /v1/models), or the command
stops here with nothing uploaded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from openrelay.cli.http import ApiClient, Refused, say
from openrelay.config import BatchLimits
from openrelay.validation.record_urls import urls_of_records
from openrelay.wording import plural

__all__ = ["DEFAULT_ENDPOINT", "served_endpoints", "urls_named", "endpoint_for"]

DEFAULT_ENDPOINT = "/v1/chat/completions"  # for an input the CLI cannot read records' urls from (--input-file-id)


def served_endpoints(client: ApiClient) -> list[str]:
    """The endpoints at least one model of the catalog serves, sorted."""
    models = client.get("models").get("data") or []
    return sorted({endpoint for model in models for endpoint in model.get("endpoints") or []})


def urls_named(path: Path) -> Counter[str]:
    """How many records of the JSONL file at ``path`` name each ``url``, read line by line as the create reads
    them (up to its record limit; a line that is not a JSON object with a string ``url`` names none)."""
    with path.open("rb") as handle:
        return urls_of_records(handle, max_records=BatchLimits.max_records, max_line_bytes=BatchLimits.max_line_bytes)


def _served_list(served: list[str]) -> str:
    return ", ".join(served) if served else "none, the catalog offers no model"


def endpoint_for(client: ApiClient, given: str | None, input_file: Path | None) -> str:
    """The endpoint to create for: ``given``, else the url every record of ``input_file`` names (the default
    when there is no local file, or no record names one); refused when no model serves it, or the records name
    several."""
    served = served_endpoints(client)
    unsent = "; nothing was uploaded" if input_file is not None else ""
    if given is not None:
        if given not in served:
            raise Refused(f"no model of the catalog serves {given} (served: {_served_list(served)}){unsent}",
                          code="endpoint_not_served", param="endpoint")
        return given
    found = urls_named(input_file) if input_file is not None else Counter()
    if not found:
        if DEFAULT_ENDPOINT not in served:
            raise Refused(f"no model of the catalog serves {DEFAULT_ENDPOINT}, the default: give --endpoint, one "
                          f"of {_served_list(served)}", code="endpoint_not_served", param="endpoint")
        return DEFAULT_ENDPOINT
    if len(found) == 1:
        (url,) = found
        if url not in served:
            raise Refused(f"the records' url is {url}, which no model of the catalog serves (served: "
                          f"{_served_list(served)}){unsent}", code="endpoint_not_served", param="endpoint")
        say(f"endpoint {url}: the url the records name ({plural(found[url], 'record')})")
        return url
    counted = ", ".join(f"{url} ({plural(count, 'record')}{'' if url in served else ', served by no model'})"
                        for url, count in sorted(found.items(), key=lambda item: (-item[1], item[0])))
    offered = [url for url in sorted(found) if url in served] or served
    raise Refused(f"the records name {len(found)} endpoints: {counted}; a batch has one, so give --endpoint (one of "
                  f"{_served_list(offered)}; records with another url are then rejected){unsent}",
                  code="endpoint_ambiguous", param="endpoint")
