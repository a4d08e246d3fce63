-- An admin's request to switch an empty GPU between MIG and time-slice mode;
-- the node's worker applies it and clears it once the hardware agrees.
ALTER TABLE gpus ADD COLUMN requested_mode TEXT CHECK (requested_mode IN ('mig', 'timeslice'));
