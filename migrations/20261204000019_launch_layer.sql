-- Launch-layer enforcement of time-sliced shares (the shim): a process on
-- a share's GPU without the shim is evidence of its own kind, and each GPU
-- says how its shares are enforced (launch, freezer or mps; NULL: not
-- reported yet, or not a time-sliced GPU).
ALTER TABLE security_evidence DROP CONSTRAINT security_evidence_detector_check;
ALTER TABLE security_evidence ADD CONSTRAINT security_evidence_detector_check
    CHECK (detector IN ('intruder_process', 'foreign_account', 'exec_refusals', 'share_memory',
                        'sign_in_failures', 'token_new_address', 'response', 'unshimmed_process'));

ALTER TABLE gpus ADD COLUMN share_enforcement TEXT
    CHECK (share_enforcement IN ('launch', 'freezer', 'mps'));
