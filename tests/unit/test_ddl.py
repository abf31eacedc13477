"""proxy.sqltext.ddl: DDL is judged where the server evaluates something, and nowhere else.

Precision: real DDL (DM v8.5.5's own tables from its source, what TiDB and MariaDB print for
SHOW CREATE TABLE, DM's replicated ALTERs) calls nothing. Safety: a stored function in any
place the server evaluates -- the query of CREATE TABLE ... SELECT, DEFAULT, generated columns,
CHECK, functional key parts, partitioning, an event's schedule -- is still a call, however the
text is dressed (qualified, quoted, inside an executable comment that runs).
"""

from __future__ import annotations

import pytest

from proxy.sqltext import classify, tokenize
from proxy.sqltext.dialect import MARIADB, TIDB

DIALECTS = [MARIADB, TIDB]

# DM v8.5.5 (pingcap/tiflow dm/syncer/checkpoint.go, online-ddl-tools/online_ddl.go,
# sharding_group.go, validator_checkpoint.go, dm/loader/checkpoint.go), verbatim.
DM_DDL = [
    """CREATE TABLE IF NOT EXISTS `dm_meta`.`task_syncer_checkpoint` (
			id VARCHAR(32) NOT NULL,
			cp_schema VARCHAR(128) NOT NULL,
			cp_table VARCHAR(128) NOT NULL,
			binlog_name VARCHAR(128),
			binlog_pos INT UNSIGNED,
			binlog_gtid TEXT,
			exit_safe_binlog_name VARCHAR(128) DEFAULT '',
			exit_safe_binlog_pos INT UNSIGNED DEFAULT 0,
			exit_safe_binlog_gtid TEXT,
			table_info JSON NOT NULL,
			is_global BOOLEAN,
			create_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
			update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
			UNIQUE KEY uk_id_schema_table (id, cp_schema, cp_table)
		)""",
    """CREATE TABLE IF NOT EXISTS `dm_meta`.`task_onlineddl` (
			id VARCHAR(32) NOT NULL,
			ghost_schema VARCHAR(128) NOT NULL,
			ghost_table VARCHAR(128) NOT NULL,
			ddls text,
			update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
			UNIQUE KEY uk_id_schema_table (id, ghost_schema, ghost_table)
		)""",
    """CREATE TABLE IF NOT EXISTS `dm_meta`.`task_syncer_sharding_meta` (
		source_id VARCHAR(32) NOT NULL COMMENT 'replica source id, defined in task.yaml',
		target_table_id VARCHAR(144) NOT NULL,
		source_table_id  VARCHAR(144) NOT NULL,
		active_index INT,
		is_global BOOLEAN,
		data JSON,
		create_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
		update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
		UNIQUE KEY uk_source_id_table_id_source (source_id, target_table_id, source_table_id)
	)""",
    """CREATE TABLE IF NOT EXISTS `dm_meta`.`task_validator_pending_change` (
			id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			source VARCHAR(32) NOT NULL,
			schema_name VARCHAR(128) NOT NULL,
			table_name VARCHAR(128) NOT NULL,
			row_pk VARCHAR(2048) NOT NULL,
			data JSON NOT NULL,
			revision bigint NOT NULL,
			create_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
			update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
			INDEX idx_source_schema_table_key(source, schema_name, table_name, row_pk),
			INDEX idx_revision(revision)
		)""",
    """CREATE TABLE IF NOT EXISTS `dm_meta`.`task_validator_error_change` (
			id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			row_pk VARCHAR(2048) NOT NULL,
			error_type int NOT NULL,
			UNIQUE KEY uk_source_schema_table_key(source, src_schema_name, src_table_name, row_pk),
            INDEX idx_status(status)
		)""",
    """CREATE TABLE IF NOT EXISTS `dm_meta`.`task_lightning_checkpoint_list` (
		task_name varchar(255) NOT NULL,
		source_name varchar(255) NOT NULL,
		status varchar(10) NOT NULL DEFAULT 'init' COMMENT 'init,running,finished',
		PRIMARY KEY (task_name, source_name)
	);
""",
    "CREATE SCHEMA IF NOT EXISTS `dm_meta`",
]

# What TiDB 8.5 and MariaDB 10.11 print for SHOW CREATE TABLE (DM's schema tracker and the
# load phase send such text), and DDL as DM restores it from the upstream binlog.
SHOWN_DDL = [
    "CREATE TABLE `t` (\n  `id` bigint(20) NOT NULL,\n  `c` varchar(20) COLLATE utf8mb4_bin DEFAULT NULL,\n"
    "  PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */,\n  KEY `idx_c` (`c`(10))\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE `t` (\n  `id` bigint(20) NOT NULL /*T![auto_rand] AUTO_RANDOM(5) */,\n  PRIMARY KEY (`id`) "
    "/*T![clustered_index] CLUSTERED */\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 /*T![auto_rand_base] AUTO_RANDOM_BASE=30001 */",
    "CREATE TABLE `orders` (\n  `id` int(11) NOT NULL AUTO_INCREMENT,\n  `customer_id` int(11) NOT NULL,\n"
    "  `total` decimal(12,2) NOT NULL DEFAULT 0.00,\n  `note` text DEFAULT NULL,\n"
    "  `created` datetime(6) NOT NULL DEFAULT current_timestamp(6) ON UPDATE current_timestamp(6),\n"
    "  `state` enum('new','paid','shipped') NOT NULL DEFAULT 'new',\n  `flags` set('a','b') DEFAULT NULL,\n"
    "  `uuid` binary(16) DEFAULT unhex(replace(uuid(),'-','')),\n  `amount_x2` decimal(13,2) GENERATED ALWAYS AS (`total` * 2) VIRTUAL,\n"
    "  PRIMARY KEY (`id`),\n  UNIQUE KEY `uk_customer` (`customer_id`,`created`),\n  KEY `idx_note` (`note`(32)),\n"
    "  CONSTRAINT `fk_customer` FOREIGN KEY (`customer_id`) REFERENCES `customers` (`id`) ON DELETE CASCADE,\n"
    "  CONSTRAINT `chk_total` CHECK (`total` >= 0)\n) ENGINE=InnoDB AUTO_INCREMENT=5 DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci",
    "CREATE TABLE `p` (`a` int, `d` date, `s` double precision(10,2), `n` national char(5), `v` char varying(9))"
    " PARTITION BY RANGE (year(`d`)) (PARTITION `p0` VALUES LESS THAN (2000), PARTITION p1 VALUES LESS THAN MAXVALUE)",
    "CREATE TABLE p2 (a INT, b INT) PARTITION BY LIST COLUMNS(a, b) (PARTITION p0 VALUES IN ((1, 2), (3, 4)))",
    "CREATE TABLE p3 (a INT) PARTITION BY LINEAR HASH (a) PARTITIONS 4",
    "CREATE TABLE p4 (a INT, KEY k USING BTREE (a)) PARTITION BY KEY (a) SUBPARTITION BY HASH (a) SUBPARTITIONS 2",
    "CREATE TABLE IF NOT EXISTS `db`.`t` (`id` INT PRIMARY KEY,`c` VARCHAR(20) CHARACTER SET UTF8MB4 COLLATE utf8mb4_bin)",
    "CREATE TABLE `t2` LIKE `t`",
    "CREATE TABLE t3 (LIKE t)",
    "CREATE TABLE v (id INT, e VECTOR(3), VECTOR INDEX vi ((VEC_COSINE_DISTANCE(e))))",
    "CREATE TABLE h (a INT, s DATETIME, e DATETIME, PERIOD FOR app (s, e))",
    "CREATE TABLE f (a INT, b INT, FULLTEXT KEY ft (b), SPATIAL INDEX (a), UNIQUE (b), KEY (a, b))",
    "CREATE UNIQUE INDEX `uk_c` ON `db`.`t` (`c`(10), `d`)",
    "CREATE INDEX idx ON t (a) USING BTREE",
    "ALTER TABLE `db`.`t` ADD COLUMN `c2` VARCHAR(20) DEFAULT 'x' AFTER `c`",
    "ALTER TABLE `db`.`t` ADD INDEX `idx_c2`(`c2`(8))",
    "ALTER TABLE `db`.`t` ADD UNIQUE KEY uk (a, b), ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES p(id)",
    "ALTER TABLE `db`.`t` MODIFY COLUMN `c` VARCHAR(255) NOT NULL, CHANGE `a` `b` INT(11) UNSIGNED",
    "ALTER TABLE t ALTER COLUMN c SET DEFAULT 5, ADD (x INT, y DECIMAL(5,2))",
    "ALTER TABLE t ADD PARTITION (PARTITION p3 VALUES LESS THAN (2030))",
    "ALTER TABLE t REORGANIZE PARTITION p0 INTO (PARTITION n0 VALUES LESS THAN (5), PARTITION n1 VALUES LESS THAN (10))",
    "ALTER TABLE t ENGINE=InnoDB PARTITION BY HASH (a) PARTITIONS 2",
    "ALTER TABLE t ADD INDEX ix ((lower(c)))",
    "CREATE VIEW v AS SELECT f(a) FROM t",  # stored, not run
    "CREATE DEFINER = CURRENT_USER() TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET NEW.a = f()",
    "CREATE FUNCTION g(x INT) RETURNS INT DETERMINISTIC RETURN f(x)",
    "CREATE EVENT e ON SCHEDULE EVERY 1 HOUR STARTS NOW() DO INSERT INTO t VALUES (f())",
    # Types, defaults and options real schemas use (built-in functions are not stored ones).
    "CREATE TABLE t (a DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),"
    " e ENUM('a','b') NOT NULL DEFAULT 'a', s SET('x','y'), b BIT(1) DEFAULT b'0', f FLOAT(7,4),"
    " y YEAR(4), j JSON, g GEOMETRY, i INET6, u UUID, h INT1(3), k FIXED(10,2), l LONG VARCHAR)",
    "CREATE TABLE t (id BINARY(16) DEFAULT (UUID_TO_BIN(UUID())) PRIMARY KEY, c CHAR(1) DEFAULT (CHAR(65)))",
    "CREATE TABLE t (count INT, `user` VARCHAR(10), `year` YEAR, KEY k_year (`year`), KEY k_user (`user`(5)))",
    "CREATE TABLE t (a JSON, b INT AS (JSON_EXTRACT(a, '$.id')) STORED, KEY (b), CHECK (b IN (1, 2)) NOT ENFORCED)",
    "CREATE TABLE t (ts TIMESTAMP) PARTITION BY RANGE (UNIX_TIMESTAMP(ts))"
    " (PARTITION p0 VALUES LESS THAN (UNIX_TIMESTAMP('2020-01-01 00:00:00')), PARTITION p1 VALUES LESS THAN MAXVALUE)",
    "CREATE TABLE t (created DATETIME) /*T![ttl] TTL=`created` + INTERVAL 1 DAY */ /*T![ttl] TTL_ENABLE='ON' */",
    "CREATE TABLE t (id BIGINT PRIMARY KEY /*T![auto_rand] AUTO_RANDOM(5) */) SHARD_ROW_ID_BITS = 4",
    "CREATE TABLE t (a INT KEY, b INT UNIQUE KEY, c INT UNIQUE, INDEX USING HASH (b), PRIMARY KEY (a, b) NONCLUSTERED)",
    "ALTER TABLE t ADD COLUMN IF NOT EXISTS c INT, ADD INDEX IF NOT EXISTS i (a), DROP COLUMN IF EXISTS d",
    "ALTER TABLE t ALGORITHM=INPLACE, LOCK=NONE, ADD FULLTEXT INDEX ft (a) WITH PARSER ngram",
    "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    "ALTER TABLE t EXCHANGE PARTITION p WITH TABLE t2",
    "ALTER TABLE t SET TIFLASH REPLICA 1",
    "CREATE INDEX f ON t (g(1))",  # column g, a prefix of 1
]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.flavor)
@pytest.mark.parametrize("sql", DM_DDL + SHOWN_DDL)
def test_real_ddl_calls_nothing(sql, dialect):
    s = classify(sql, dialect=dialect)
    assert (s.runs_code, s.session_unrestorable, s.unknown) == (False, None, None)
    assert s.implicit_commit


# A stored function in each place the server evaluates.
CALLS = ["f(1)", "db.f(1)", "`f`(1)", "`db`.`f`(1)"]
EVALUATED = [
    "CREATE TABLE t (a INT DEFAULT ({e}))",
    "CREATE TABLE t (a INT DEFAULT {e})",
    "CREATE TABLE t (a INT NOT NULL DEFAULT 0 CHECK (a > {e}))",
    "CREATE TABLE t (a INT, b INT AS ({e}) VIRTUAL)",
    "CREATE TABLE t (a INT, b INT GENERATED ALWAYS AS (a + {e}) STORED)",
    "CREATE TABLE t (a INT, CHECK (a <> {e}))",
    "CREATE TABLE t (a INT, CONSTRAINT c CHECK (a <> {e}))",
    "CREATE TABLE t (a INT, KEY k ((a + {e})))",
    "CREATE TABLE t (a INT, UNIQUE KEY k (a, ({e})))",
    "CREATE TABLE t (a INT) PARTITION BY HASH ({e})",
    "CREATE TABLE t (a INT) PARTITION BY RANGE (a) (PARTITION p0 VALUES LESS THAN ({e}))",
    "CREATE TABLE t (a INT) PARTITION BY LIST (a) (PARTITION p0 VALUES IN (1, {e}))",
    "CREATE TABLE t (a INT) SELECT {e} AS a",
    "CREATE TABLE t (a INT) IGNORE SELECT {e} AS a",
    "CREATE TABLE t AS SELECT {e} AS a",
    "CREATE TABLE t SELECT * FROM (SELECT {e}) AS x",
    "CREATE TABLE t (a INT) (SELECT {e})",
    "CREATE TABLE t (a INT) ((SELECT {e}))",
    "CREATE TABLE t (a INT) PARTITION BY KEY (a) PARTITIONS 2 ((SELECT {e}))",
    "CREATE TABLE t (a INT) WITH c AS (SELECT {e}) SELECT * FROM c",
    "CREATE OR REPLACE TABLE t (a INT) SELECT {e}",
    "CREATE TABLE IF NOT EXISTS t (KEY (a)) SELECT {e} AS a",
    "CREATE TABLE t (a INT /*!99999 , b INT */ DEFAULT ({e}))",
    "CREATE TABLE t (a INT) /*! SELECT {e} */",
    "CREATE INDEX i ON t ((a + {e}))",
    "CREATE INDEX i ON t (a(10), ({e}))",
    "ALTER TABLE t ADD COLUMN c INT DEFAULT ({e})",
    "ALTER TABLE t ADD c INT AS ({e})",
    "ALTER TABLE t ADD (c INT DEFAULT ({e}))",
    "ALTER TABLE t MODIFY c INT DEFAULT ({e})",
    "ALTER TABLE t CHANGE c d INT CHECK (d > {e})",
    "ALTER TABLE t ALTER COLUMN c SET DEFAULT ({e})",
    "ALTER TABLE t ADD CONSTRAINT ck CHECK ({e} > 0)",
    "ALTER TABLE t ADD INDEX ix (({e}))",
    "ALTER TABLE t PARTITION BY HASH ({e}) PARTITIONS 2",
    "ALTER TABLE t ORDER BY {e}",
    "CREATE EVENT e ON SCHEDULE AT {e} DO SELECT 1",
    "CREATE EVENT e ON SCHEDULE EVERY 1 DAY STARTS {e} DO SELECT 1",
    # A column named like a clause word is a column: `key` INT DEFAULT (...) is no index.
    "CREATE TABLE t (`key` INT DEFAULT ({e}))",
    "CREATE TABLE t (`unique` INT, `check` INT, `default` INT AS ({e}))",
    "CREATE TABLE t (`range` INT, `than` INT, `auto_random` INT DEFAULT ({e}))",
    "CREATE TABLE t (vector INT, b INT DEFAULT ({e}))",
    "ALTER TABLE t CHANGE `key` `unique` INT DEFAULT ({e})",
    # What follows a key, a reference, a partition list is read again as what it is.
    "CREATE TABLE t (a INT, KEY k (a(10) DESC) USING HASH COMMENT 'x', b INT DEFAULT ({e}))",
    "CREATE TABLE t (a INT REFERENCES p (id) ON DELETE CASCADE, b INT AS ({e}))",
    "CREATE TABLE t (a INT, CONSTRAINT PRIMARY KEY (a), CONSTRAINT CHECK ({e}))",
    "CREATE TABLE t (a INT, KEY k (a(({e}))))",
    "CREATE TABLE t (a INT) PARTITION BY RANGE (a) SUBPARTITION BY HASH ({e}) (PARTITION p0 VALUES LESS THAN (1))",
    "CREATE TABLE t (a INT) PARTITION BY HASH (a) (PARTITION p0 COMMENT 'x') SELECT {e}",
    "CREATE TABLE t (a INT) UNION = (t1, t2) SELECT {e}",
    "CREATE TABLE t (a TIMESTAMP DEFAULT 0 ON UPDATE {e})",
    "CREATE TABLE t (a INT) SELECT 1 UNION SELECT {e}",
    "ALTER TABLE t ADD KEY k (a), ALTER INDEX i INVISIBLE, ADD COLUMN b INT DEFAULT ({e})",
    "ALTER TABLE t ADD PRIMARY KEY (a), ADD b INT DEFAULT ({e})",
    # TiDB's TTL is an expression too.
    "CREATE TABLE t (c DATETIME) TTL = {e} + INTERVAL 1 DAY",
    "ALTER TABLE t TTL = {e} + INTERVAL 1 DAY",
]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("template", EVALUATED)
def test_a_call_where_the_server_evaluates_is_a_call(template, call):
    assert classify(template.format(e=call), dialect=MARIADB).runs_code


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE t (a INT DEFAULT (GET_LOCK('x', 0)))",
        "CREATE TABLE t SELECT GET_LOCK('x', 0)",
        "CREATE TABLE t SELECT @v := 1 AS a",
        "ALTER TABLE t ADD COLUMN c INT DEFAULT (GET_LOCK('x', 0))",
    ],
)
def test_session_effects_in_ddl_are_seen(sql):
    assert classify(sql, dialect=MARIADB).session_unrestorable


def test_tidb_comments_are_judged_as_tidb_reads_them():
    # TiDB runs a /*T![feature] */ it knows (the call is seen) and skips one it does not.
    known = "CREATE TABLE t (a INT) /*T![ttl] SELECT f(1) */"
    unknown_feature = "CREATE TABLE t (a INT) /*T![no_such_feature] SELECT f(1) */"
    assert classify(known, dialect=TIDB).runs_code
    assert not classify(unknown_feature, dialect=TIDB).runs_code
    assert not classify(known, dialect=MARIADB).runs_code  # a plain comment there
    # /*M! is a plain comment on TiDB; 5 version digits, the sixth is code.
    assert not classify("CREATE TABLE t (a INT) /*M!100100 SELECT f(1) */", dialect=TIDB).runs_code
    assert [t.text for t in tokenize("SELECT 1 /*!400000 , 2 */", dialect=TIDB)] == ["SELECT", "1", "0", ",", "2"]
    assert classify("SELECT 1 /*!40000 , f(1) */", dialect=TIDB).runs_code
    # "--" starts a comment on TiDB only before a space (Go's unicode.IsSpace), not any control.
    assert [t.text for t in tokenize("SELECT 1 --\x01, 2", dialect=TIDB)][-2:] == [",", "2"]
    assert [t.text for t in tokenize("SELECT 1 --\x01, 2", dialect=MARIADB)] == ["SELECT", "1"]
