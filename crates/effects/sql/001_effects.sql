-- The effects ledger (palisade-effects). One fence per lock: the highest epoch that began an
-- attempt under it; an attempt with a lower epoch is refused. One row per operation; `record`
-- is the full record (JSON), `state` and `updated_ms` are copies for queries and indexes.
CREATE TABLE IF NOT EXISTS palisade_effect_fences (
    lock  text   PRIMARY KEY,
    epoch bigint NOT NULL CHECK (epoch >= 0)
);
CREATE TABLE IF NOT EXISTS palisade_effect_ops (
    lock       text   NOT NULL,
    op         text   NOT NULL,
    state      text   NOT NULL,
    updated_ms bigint NOT NULL,
    record     jsonb  NOT NULL,
    PRIMARY KEY (lock, op)
);
CREATE INDEX IF NOT EXISTS palisade_effect_ops_by_state
    ON palisade_effect_ops (state, updated_ms);
-- A fence never moves down, whoever writes it.
CREATE OR REPLACE FUNCTION palisade_effect_fence_up() RETURNS trigger AS $$
BEGIN
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'the effects ledger fence of % cannot move down from % to %',
            OLD.lock, OLD.epoch, NEW.epoch USING ERRCODE = 'P5101';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS palisade_effect_fence_up ON palisade_effect_fences;
CREATE TRIGGER palisade_effect_fence_up BEFORE UPDATE ON palisade_effect_fences
    FOR EACH ROW EXECUTE FUNCTION palisade_effect_fence_up();
