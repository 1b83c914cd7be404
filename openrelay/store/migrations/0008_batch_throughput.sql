-- Live progress numbers (openrelay/store/throughput.py): a running batch's rolling record of the last minute's
-- durable flushes, written in the transaction that commits each chunk, so a poll reads the batch's rate from the
-- batch's own row instead of summing its chunks. JSON: [[second, records, tokens], ...], oldest first.
ALTER TABLE batches ADD COLUMN throughput_window TEXT;
