-- stock_apply_v1: a batch of stock operations on one item in one
-- statement (package stock; the rules of stockdriver.Apply), by the
-- server's clock, so that the item's row is locked only while the
-- statement runs. kinds: 1 take, 2 hold, 3 confirm, 4 release, 5 add,
-- 6 set (stockdriver.Kind); states: 0 none, 1 sold, 2 held, 3 sold out,
-- 4 released, 5 expired, 6 no item, 7 mismatch (stockdriver.State).
-- Returns row 0 (the item: exists, level, holds ended) and row i for op i.
CREATE OR REPLACE FUNCTION {prefix}stock_apply_v1(p_item bytea, p_kinds smallint[], p_keys bytea[], p_units bigint[], p_ttls bigint[], p_keeps bigint[])
RETURNS TABLE (idx integer, st smallint, units bigint, remaining bigint, replayed boolean,
	found boolean, put bigint, free bigint, held bigint, sold bigint, expired integer)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
	now_ms bigint := CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint);
	v_found boolean;
	v_put bigint := 0; v_free bigint := 0; v_held bigint := 0; v_sold bigint := 0;
	v_expired integer := 0;
	r record;
	i integer;
	n integer := coalesce(array_length(p_kinds, 1), 0);
	k smallint; key bytea; u bigint; d bigint;
	rk smallint; rs smallint; ru bigint; rd bigint; ru_until bigint; rkeep bigint; has boolean;
	o_st smallint[] := '{}'; o_units bigint[] := '{}'; o_rem bigint[] := '{}'; o_rep boolean[] := '{}';
BEGIN
	SELECT it.put, it.free, it.held, it.sold INTO v_put, v_free, v_held, v_sold
		FROM {prefix}stock_items it WHERE it.item = p_item FOR UPDATE;
	v_found := FOUND;
	IF NOT v_found THEN
		v_put := 0; v_free := 0; v_held := 0; v_sold := 0;
	END IF;
	IF NOT v_found AND (5 = ANY(p_kinds) OR 6 = ANY(p_kinds)) THEN
		INSERT INTO {prefix}stock_items AS it (item, put, free, held, sold) VALUES (p_item, 0, 0, 0, 0) ON CONFLICT (item) DO NOTHING;
		SELECT it.put, it.free, it.held, it.sold INTO v_put, v_free, v_held, v_sold
			FROM {prefix}stock_items it WHERE it.item = p_item FOR UPDATE;
	END IF;
	IF v_found THEN
		-- The holds that ran out: their units are free again.
		FOR r IN SELECT s.take_key, s.units FROM {prefix}stock_records s
				WHERE s.item = p_item AND s.state = 2 AND s.deadline_ms <= now_ms ORDER BY s.deadline_ms LIMIT 256 LOOP
			v_held := v_held - r.units; v_free := v_free + r.units; v_expired := v_expired + 1;
			UPDATE {prefix}stock_records s SET state = 5, until_ms = greatest(s.until_ms, now_ms + s.keep_ms)
				WHERE s.item = p_item AND s.take_key = r.take_key;
		END LOOP;
	END IF;
	FOR i IN 1..n LOOP
		k := p_kinds[i]; key := p_keys[i]; u := p_units[i];
		o_rem := o_rem || 0::bigint; o_rep := o_rep || false;
		IF k = 6 THEN -- set: start over
			v_found := true; v_free := u; v_sold := 0; v_put := u + v_held;
			o_st := o_st || 0::smallint; o_units := o_units || u; CONTINUE;
		ELSIF k = 5 THEN -- add
			IF v_free + u < 0 THEN
				o_st := o_st || 3::smallint;
			ELSE
				v_found := true; v_free := v_free + u; v_put := v_put + u; o_st := o_st || 0::smallint;
			END IF;
			o_units := o_units || u; CONTINUE;
		ELSIF NOT v_found THEN
			o_st := o_st || 6::smallint; o_units := o_units || u; CONTINUE;
		END IF;
		SELECT s.kind, s.state, s.units, s.deadline_ms, s.until_ms, s.keep_ms INTO rk, rs, ru, rd, ru_until, rkeep
			FROM {prefix}stock_records s WHERE s.item = p_item AND s.take_key = key;
		has := FOUND;
		IF has AND NOT ((rk = 1 AND rs IN (1, 3)) OR (rk = 2 AND rs BETWEEN 1 AND 5)) THEN
			RAISE EXCEPTION 'ONCEKIT_LAYOUT stock record of state %', rs;
		END IF;
		IF has AND rs <> 2 AND ru_until <= now_ms THEN
			has := false; -- forgotten
		END IF;
		IF has AND rs = 2 AND rd <= now_ms THEN -- its hold ran out (past the sweep's bound)
			v_held := v_held - ru; v_free := v_free + ru; v_expired := v_expired + 1; rs := 5;
			ru_until := greatest(ru_until, now_ms + rkeep);
			UPDATE {prefix}stock_records s SET state = 5, until_ms = ru_until WHERE s.item = p_item AND s.take_key = key;
		END IF;
		IF k IN (1, 2) THEN
			IF has THEN
				o_units := o_units || ru;
				IF rk <> k OR ru <> u THEN
					o_st := o_st || 7::smallint;
				ELSE
					o_st := o_st || rs; o_rep[i] := true;
					IF rs = 2 THEN o_rem[i] := rd - now_ms; END IF;
				END IF;
			ELSE
				o_units := o_units || u;
				IF v_free < u THEN
					rs := 3; rd := 0; ru_until := now_ms + p_keeps[i];
				ELSIF k = 1 THEN
					v_free := v_free - u; v_sold := v_sold + u; rs := 1; rd := 0; ru_until := now_ms + p_keeps[i];
				ELSE
					v_free := v_free - u; v_held := v_held + u; rs := 2; rd := now_ms + p_ttls[i]; ru_until := rd + p_keeps[i];
					o_rem[i] := p_ttls[i];
				END IF;
				o_st := o_st || rs;
				INSERT INTO {prefix}stock_records AS s (item, take_key, kind, state, units, deadline_ms, until_ms, keep_ms)
					VALUES (p_item, key, k, rs, u, rd, ru_until, p_keeps[i])
					ON CONFLICT (item, take_key) DO UPDATE SET kind = EXCLUDED.kind, state = EXCLUDED.state, units = EXCLUDED.units,
						deadline_ms = EXCLUDED.deadline_ms, until_ms = EXCLUDED.until_ms, keep_ms = EXCLUDED.keep_ms;
			END IF;
		ELSE -- confirm (3) or release (4)
			IF NOT has THEN
				o_st := o_st || 0::smallint; o_units := o_units || 0::bigint;
			ELSIF rk <> 2 THEN
				o_st := o_st || 7::smallint; o_units := o_units || ru;
			ELSIF rs <> 2 THEN
				o_st := o_st || rs; o_units := o_units || ru; o_rep[i] := true;
			ELSE
				v_held := v_held - ru;
				IF k = 3 THEN v_sold := v_sold + ru; rs := 1; ELSE v_free := v_free + ru; rs := 4; END IF;
				o_st := o_st || rs; o_units := o_units || ru;
				UPDATE {prefix}stock_records s SET state = rs, until_ms = greatest(s.until_ms, now_ms + s.keep_ms)
					WHERE s.item = p_item AND s.take_key = key;
			END IF;
		END IF;
	END LOOP;
	IF v_found THEN
		UPDATE {prefix}stock_items it SET put = v_put, free = v_free, held = v_held, sold = v_sold WHERE it.item = p_item;
	ELSE
		DELETE FROM {prefix}stock_items it WHERE it.item = p_item AND it.put = 0 AND it.sold = 0 AND it.held = 0;
	END IF;
	RETURN QUERY SELECT 0, 0::smallint, 0::bigint, 0::bigint, false, v_found, v_put, v_free, v_held, v_sold, v_expired;
	RETURN QUERY SELECT t.i::integer, o_st[t.i], o_units[t.i], o_rem[t.i], o_rep[t.i], false, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0
		FROM generate_subscripts(p_kinds, 1) AS t(i);
END
$fn$
