"""`orl files ...`: upload, list, inspect, delete and download files (the /v1/files API)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from openrelay.cli.http import ApiClient, print_json, run

__all__ = ["app", "content_app"]

app = typer.Typer(help="Upload, list, inspect, delete and download files.", no_args_is_help=True)
content_app = typer.Typer(help="Download a file's content.", no_args_is_help=True)
app.add_typer(content_app, name="content")

FileId = Annotated[str, typer.Argument(help="File id, e.g. file-a1b2c3d4e5f6a7b8c9d0e1f2.")]


@app.command()
def upload(
    path: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, readable=True, help="JSONL file to upload."),
    ],
    purpose: Annotated[str, typer.Option(help="File purpose.")] = "batch",
) -> None:
    """Upload a file (streamed from disk) and print the file object."""
    run(lambda client: print_json(client.upload(path, purpose)))


@app.command("list")
def list_files(
    limit: Annotated[int | None, typer.Option(min=1, help="Page size.")] = None,
    after: Annotated[str | None, typer.Option(help="Start after this file id.")] = None,
    purpose: Annotated[str | None, typer.Option(help="Only files with this purpose.")] = None,
) -> None:
    """List files, newest first (one page)."""
    params = {"limit": limit, "after": after, "purpose": purpose}
    run(lambda client: print_json(client.get("files", params)))


@app.command()
def get(file_id: FileId) -> None:
    """Print a file object."""
    run(lambda client: print_json(client.get(f"files/{file_id}")))


@app.command()
def delete(file_id: FileId) -> None:
    """Delete a file."""
    run(lambda client: print_json(client.delete(f"files/{file_id}")))


@content_app.command("get")
def content_get(
    file_id: FileId,
    output: Annotated[str, typer.Option("-o", "--output", help="Destination file; '-' for stdout.")],
) -> None:
    """Download a file's content, streamed to OUTPUT; unless OUTPUT is stdout, print what was written."""

    def body(client: ApiClient) -> None:
        client.download_to(f"files/{file_id}/content", output)
        if output != "-":
            dest = Path(output)
            print_json({"id": file_id, "path": str(dest.resolve()), "bytes": dest.stat().st_size})

    run(body)
