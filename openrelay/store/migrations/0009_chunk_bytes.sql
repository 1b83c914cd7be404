-- Results while running (openrelay/service/partial_results.py): the size of each chunk's out and err blobs,
-- written with the chunk's row, so that a read of a running batch's result file knows its length from the rows
-- alone instead of asking the blob store once per chunk. Null for chunks committed before this migration.
ALTER TABLE batch_chunks ADD COLUMN out_bytes BIGINT;
ALTER TABLE batch_chunks ADD COLUMN err_bytes BIGINT;
