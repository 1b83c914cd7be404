"""Every blob key, built in one place. The layout (under the local directory or the S3 prefix)::

    files/<file id>                                   an uploaded file, or a create's inline records
    rejections/<file id>.jsonl                        the records of a create refused whole (no batch made)
    batches/<batch id>/rejections.jsonl               records the create refused
    batches/<batch id>/dispatch.bin                   the order its records are sent in (openrelay/prefix.py)
    batches/<batch id>/chunks/<seq>.<run>.<out|err>.jsonl
                                                      result lines made durable while the batch ran; <run> is
                                                      the writing run's own token, so a run that lost its lease
                                                      can never overwrite the chunk another run committed
    batches/<batch id>/unrun.jsonl                    error lines of records never run (cancelled, expired)
    batches/<batch id>/output.jsonl                   the output file: every ``out`` chunk, in order
    batches/<batch id>/error.jsonl                    the error file: every ``err`` chunk, then the unrun lines

Keys are ``/``-separated, never start with ``/`` and hold no ``..`` part (``check_key``).
"""

from __future__ import annotations

__all__ = ["file_key", "refused_create_key", "batch_folder", "rejections_key", "dispatch_order_key", "chunk_key",
           "chunks_folder", "error_tail_key", "output_key", "error_key", "check_key"]


def file_key(file_id: str) -> str:
    return f"files/{file_id}"


def refused_create_key(file_id: str) -> str:
    """The rejections file of a create whose every record was refused: there is no batch to keep it under."""
    return f"rejections/{file_id}.jsonl"


def batch_folder(batch_id: str) -> str:
    """Every blob of the batch (``BlobStore.delete_folder``: the retention prunes it whole)."""
    return f"batches/{batch_id}"


def rejections_key(batch_id: str) -> str:
    return f"{batch_folder(batch_id)}/rejections.jsonl"


def dispatch_order_key(batch_id: str) -> str:
    return f"batches/{batch_id}/dispatch.bin"


def chunk_key(batch_id: str, seq: int, kind: str, run: str) -> str:
    return f"{chunks_folder(batch_id)}/{seq:06d}.{run}.{kind}.jsonl"


def chunks_folder(batch_id: str) -> str:
    """The folder of every chunk of the batch, committed or not (``BlobStore.delete_folder``)."""
    return f"batches/{batch_id}/chunks"


def error_tail_key(batch_id: str) -> str:
    """The error file's last part, written when the batch ends: the create's rejections and the records that never
    ran, after every run-time error line."""
    return f"batches/{batch_id}/unrun.jsonl"


def output_key(batch_id: str) -> str:
    return f"batches/{batch_id}/output.jsonl"


def error_key(batch_id: str) -> str:
    return f"batches/{batch_id}/error.jsonl"


def check_key(key: str) -> str:
    """``key`` when every store can hold it; ``ValueError`` for an absolute key, an empty part or ``..``."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"bad blob key {key!r}")
    return key
