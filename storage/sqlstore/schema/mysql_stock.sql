-- stock_apply_v1: a batch of stock operations on one item in one
-- statement (package stock; the rules of stockdriver.Apply), by the
-- server's clock, so that the item's row is locked only while the call
-- runs (and its commit). p_ops is the operations, each "kind,hex(key),units,ttl_ms,keep_ms;"
-- (kinds: 1 take, 2 hold, 3 confirm, 4 release, 5 add, 6 set). The
-- answer is one row, one column: "exists,put,free,held,sold,expired" and
-- ";state,units,remaining_ms,replayed" per operation (states: 0 none,
-- 1 sold, 2 held, 3 sold out, 4 released, 5 expired, 6 no item,
-- 7 mismatch).
CREATE PROCEDURE {prefix}stock_apply_v1(IN p_item VARBINARY(512), IN p_ops LONGTEXT)
MODIFIES SQL DATA
BEGIN
	DECLARE v_now BIGINT DEFAULT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;
	DECLARE v_found, v_has, v_done BOOLEAN DEFAULT FALSE;
	DECLARE v_put, v_free, v_held, v_sold BIGINT DEFAULT 0;
	DECLARE v_expired INT DEFAULT 0;
	DECLARE v_rest LONGTEXT DEFAULT p_ops;
	DECLARE v_op, v_out LONGTEXT DEFAULT '';
	DECLARE v_k, v_rk, v_rs INT;
	DECLARE v_key VARBINARY(512);
	DECLARE v_u, v_ttl, v_keep, v_ru, v_rd, v_runtil, v_rkeep, v_rem BIGINT;
	DECLARE v_rep INT;
	DECLARE v_sk VARBINARY(512);
	DECLARE v_su BIGINT;
	DECLARE due CURSOR FOR SELECT take_key, units FROM {prefix}stock_records
		WHERE item = p_item AND state = 2 AND deadline_ms <= v_now ORDER BY deadline_ms LIMIT 256;
	DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
	DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

	START TRANSACTION;
	SET v_done = FALSE;
	SELECT put, free, held, sold INTO v_put, v_free, v_held, v_sold FROM {prefix}stock_items WHERE item = p_item FOR UPDATE;
	SET v_found = NOT v_done;
	IF NOT v_found THEN
		SET v_put = 0, v_free = 0, v_held = 0, v_sold = 0;
		IF p_ops REGEXP '(^|;)(5|6),' THEN
			INSERT IGNORE INTO {prefix}stock_items (item, put, free, held, sold) VALUES (p_item, 0, 0, 0, 0);
			SET v_done = FALSE;
			SELECT put, free, held, sold INTO v_put, v_free, v_held, v_sold FROM {prefix}stock_items WHERE item = p_item FOR UPDATE;
		END IF;
	END IF;
	-- The holds that ran out: their units are free again. (The cursor
	-- only when one did: opening one costs more than the rest of a call.)
	IF v_found AND EXISTS (SELECT 1 FROM {prefix}stock_records WHERE item = p_item AND state = 2 AND deadline_ms <= v_now) THEN
		SET v_done = FALSE;
		OPEN due;
		sweep: LOOP
			FETCH due INTO v_sk, v_su;
			IF v_done THEN LEAVE sweep; END IF;
			SET v_held = v_held - v_su, v_free = v_free + v_su, v_expired = v_expired + 1;
			UPDATE {prefix}stock_records SET state = 5, until_ms = GREATEST(until_ms, v_now + keep_ms) WHERE item = p_item AND take_key = v_sk;
		END LOOP;
		CLOSE due;
	END IF;
	ops: WHILE v_rest <> '' DO
		SET v_op = SUBSTRING_INDEX(v_rest, ';', 1);
		SET v_rest = SUBSTRING(v_rest, LENGTH(v_op) + 2);
		SET v_k = SUBSTRING_INDEX(v_op, ',', 1);
		SET v_key = UNHEX(SUBSTRING_INDEX(SUBSTRING_INDEX(v_op, ',', 2), ',', -1));
		SET v_u = SUBSTRING_INDEX(SUBSTRING_INDEX(v_op, ',', 3), ',', -1);
		SET v_ttl = SUBSTRING_INDEX(SUBSTRING_INDEX(v_op, ',', 4), ',', -1);
		SET v_keep = SUBSTRING_INDEX(v_op, ',', -1);
		SET v_rem = 0, v_rep = 0;
		IF v_k = 6 THEN -- set: start over
			SET v_found = TRUE, v_free = v_u, v_sold = 0, v_put = v_u + v_held;
			SET v_out = CONCAT(v_out, ';0,', v_u, ',0,0');
			ITERATE ops;
		ELSEIF v_k = 5 THEN -- add
			IF v_free + v_u < 0 THEN
				SET v_out = CONCAT(v_out, ';3,', v_u, ',0,0');
			ELSE
				SET v_found = TRUE, v_free = v_free + v_u, v_put = v_put + v_u;
				SET v_out = CONCAT(v_out, ';0,', v_u, ',0,0');
			END IF;
			ITERATE ops;
		ELSEIF NOT v_found THEN
			SET v_out = CONCAT(v_out, ';6,', v_u, ',0,0');
			ITERATE ops;
		END IF;
		SET v_done = FALSE;
		SELECT kind, state, units, deadline_ms, until_ms, keep_ms INTO v_rk, v_rs, v_ru, v_rd, v_runtil, v_rkeep
			FROM {prefix}stock_records WHERE item = p_item AND take_key = v_key;
		SET v_has = NOT v_done;
		IF v_has AND NOT ((v_rk = 1 AND v_rs IN (1, 3)) OR (v_rk = 2 AND v_rs BETWEEN 1 AND 5)) THEN
			SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'ONCEKIT_LAYOUT stock record of an unknown state';
		END IF;
		IF v_has AND v_rs <> 2 AND v_runtil <= v_now THEN
			SET v_has = FALSE; -- forgotten
		END IF;
		IF v_has AND v_rs = 2 AND v_rd <= v_now THEN -- its hold ran out (past the sweep's bound)
			SET v_held = v_held - v_ru, v_free = v_free + v_ru, v_expired = v_expired + 1, v_rs = 5,
				v_runtil = GREATEST(v_runtil, v_now + v_rkeep);
			UPDATE {prefix}stock_records SET state = 5, until_ms = v_runtil WHERE item = p_item AND take_key = v_key;
		END IF;
		IF v_k IN (1, 2) THEN
			IF v_has THEN
				IF v_rk <> v_k OR v_ru <> v_u THEN
					SET v_out = CONCAT(v_out, ';7,', v_ru, ',0,0');
				ELSE
					IF v_rs = 2 THEN SET v_rem = v_rd - v_now; END IF;
					SET v_out = CONCAT(v_out, ';', v_rs, ',', v_ru, ',', v_rem, ',1');
				END IF;
			ELSE
				IF v_free < v_u THEN
					SET v_rs = 3, v_rd = 0, v_runtil = v_now + v_keep;
				ELSEIF v_k = 1 THEN
					SET v_free = v_free - v_u, v_sold = v_sold + v_u, v_rs = 1, v_rd = 0, v_runtil = v_now + v_keep;
				ELSE
					SET v_free = v_free - v_u, v_held = v_held + v_u, v_rs = 2, v_rd = v_now + v_ttl, v_runtil = v_rd + v_keep, v_rem = v_ttl;
				END IF;
				INSERT INTO {prefix}stock_records (item, take_key, kind, state, units, deadline_ms, until_ms, keep_ms)
					VALUES (p_item, v_key, v_k, v_rs, v_u, v_rd, v_runtil, v_keep)
					ON DUPLICATE KEY UPDATE kind = VALUES(kind), state = VALUES(state), units = VALUES(units),
						deadline_ms = VALUES(deadline_ms), until_ms = VALUES(until_ms), keep_ms = VALUES(keep_ms);
				SET v_out = CONCAT(v_out, ';', v_rs, ',', v_u, ',', v_rem, ',0');
			END IF;
		ELSE -- confirm (3) or release (4)
			IF NOT v_has THEN
				SET v_out = CONCAT(v_out, ';0,0,0,0');
			ELSEIF v_rk <> 2 THEN
				SET v_out = CONCAT(v_out, ';7,', v_ru, ',0,0');
			ELSEIF v_rs <> 2 THEN
				SET v_out = CONCAT(v_out, ';', v_rs, ',', v_ru, ',0,1');
			ELSE
				SET v_held = v_held - v_ru;
				IF v_k = 3 THEN
					SET v_sold = v_sold + v_ru, v_rs = 1;
				ELSE
					SET v_free = v_free + v_ru, v_rs = 4;
				END IF;
				UPDATE {prefix}stock_records SET state = v_rs, until_ms = GREATEST(until_ms, v_now + keep_ms) WHERE item = p_item AND take_key = v_key;
				SET v_out = CONCAT(v_out, ';', v_rs, ',', v_ru, ',0,0');
			END IF;
		END IF;
	END WHILE ops;
	IF v_found THEN
		UPDATE {prefix}stock_items SET put = v_put, free = v_free, held = v_held, sold = v_sold WHERE item = p_item;
	ELSE
		DELETE FROM {prefix}stock_items WHERE item = p_item AND put = 0 AND sold = 0 AND held = 0;
	END IF;
	COMMIT;
	SELECT CONCAT(IF(v_found, 1, 0), ',', v_put, ',', v_free, ',', v_held, ',', v_sold, ',', v_expired, v_out) AS answer;
END
