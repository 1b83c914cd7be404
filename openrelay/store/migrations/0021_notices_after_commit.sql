-- Change notices leave the commit (openrelay/store/notices.py): the process that writes sends them after its commit,
-- coalesced in its memory, so the triggers of 0010 and 0015 and their functions are dropped by this version's hook
-- (notice_triggers.drop_change_triggers), and the table in which 0015's trigger kept each organization's last
-- notice goes. SQLite never wrote it.
DROP TABLE org_notices;
