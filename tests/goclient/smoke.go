package main

// Mode smoke: one pinned *sql.Conn exercising what DM's driver can send:
// text protocol with interpolated values, server-side prepared statements
// (binary protocol, all parameter kinds), transactions, errors mid-session,
// DSN session variables and large packets. See main.go for the output format.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

type smoke struct {
	o      *options
	ctx    context.Context
	conn   *sql.Conn
	table  string
	big    string
	ai     string
	mp     int  // server max_allowed_packet
	tidb   bool // the server is TiDB (SELECT VERSION())
	checks map[string]string
	info   map[string]interface{}
}

func runSmoke(o *options) bool {
	s := &smoke{
		o:      o,
		ctx:    context.Background(),
		checks: map[string]string{},
		info:   map[string]interface{}{},
	}
	// Unique names: several smoke runs may share a database.
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1000000)
	s.table = "goclient_smoke_" + suffix
	s.big = "goclient_big_" + suffix
	s.ai = "goclient_ai_" + suffix

	db := o.openDB(2)
	defer db.Close()

	connected := s.run("connect", func() error {
		ctx, cancel := context.WithTimeout(s.ctx, o.connectTimeout+5*time.Second)
		defer cancel()
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		s.conn = conn
		return conn.PingContext(ctx)
	})
	if connected {
		defer s.conn.Close()
		s.run("max_allowed_packet", s.checkMaxAllowedPacket)
		s.run("session_vars", s.checkSessionVars)
		s.run("charset", s.checkCharset)
		if s.run("create_tables", s.createTables) {
			s.run("insert_interpolated", s.insertInterpolated)
			s.run("insert_prepared", func() error {
				return s.withStatusIncrease([]string{"Com_stmt_prepare", "Com_stmt_execute", "Com_stmt_close"}, s.insertPrepared)
			})
			s.run("select_text", s.selectText)
			s.run("select_prepared", s.selectPrepared)
			s.run("params_interpolated", func() error { return s.checkParams(false) })
			s.run("params_prepared", func() error { return s.checkParams(true) })
			s.run("empty_result", s.emptyResult)
			s.run("ok_packet_fields", s.okPacketFields)
			s.run("txn_commit", s.txnCommit)
			s.run("txn_rollback", s.txnRollback)
			s.run("dup_key_then_query", s.dupKeyThenQuery)
			s.run("dup_key_in_txn", s.dupKeyInTxn)
			s.run("big_string", s.bigString)
			if o.longData {
				longData := []string{"Com_stmt_send_long_data"}
				s.run("long_data_prepared", func() error { return s.withStatusIncrease(longData, s.longDataPrepared) })
				s.run("interpolate_fallback", func() error { return s.withStatusIncrease(longData, s.interpolateFallback) })
			}
			s.run("ping", func() error { return s.conn.PingContext(s.ctx) })
			s.run("drop_tables", s.dropTables)
		}
	}

	ok := true
	for _, v := range s.checks {
		if v != "ok" {
			ok = false
		}
	}
	emit(o, map[string]interface{}{"mode": "smoke", "ok": ok, "checks": s.checks, "info": s.info})
	return ok
}

// run records the outcome of one check; a panic counts as a failure.
func (s *smoke) run(name string, f func() error) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			s.checks[name] = fmt.Sprintf("panic: %v", r)
			ok = false
		}
	}()
	start := time.Now()
	err := f()
	if err != nil {
		s.checks[name] = err.Error()
		fmt.Fprintf(os.Stderr, "smoke: %s FAILED after %s: %v\n", name, time.Since(start), err)
		return false
	}
	s.checks[name] = "ok"
	return true
}

func (s *smoke) queryString(q string, args ...interface{}) (string, error) {
	var v sql.NullString
	if err := s.conn.QueryRowContext(s.ctx, q, args...).Scan(&v); err != nil {
		return "", fmt.Errorf("%s: %w", q, err)
	}
	if !v.Valid {
		return "", fmt.Errorf("%s: got NULL", q)
	}
	return v.String, nil
}

func (s *smoke) checkMaxAllowedPacket() error {
	// The driver already ran SELECT @@max_allowed_packet itself
	// (maxAllowedPacket=0); the long-data checks prove it used the value.
	v, err := s.queryString("SELECT @@max_allowed_packet")
	if err != nil {
		return err
	}
	s.mp, err = strconv.Atoi(v)
	if err != nil || s.mp <= 0 {
		return fmt.Errorf("bad @@max_allowed_packet %q", v)
	}
	s.info["max_allowed_packet"] = s.mp
	if version, err := s.queryString("SELECT VERSION()"); err == nil {
		s.info["version"] = version
		s.tidb = strings.Contains(version, "-TiDB-")
	}
	if id, err := s.queryString("SELECT CONNECTION_ID()"); err == nil {
		s.info["connection_id"] = id
	}
	return nil
}

func sameSetting(name, want, got string) bool {
	if strings.EqualFold(want, got) {
		return true
	}
	if strings.EqualFold(name, "sql_mode") {
		set := func(v string) map[string]bool {
			m := map[string]bool{}
			for _, p := range strings.Split(strings.ToUpper(v), ",") {
				if p = strings.TrimSpace(p); p != "" {
					m[p] = true
				}
			}
			return m
		}
		a, b := set(want), set(got)
		if len(a) != len(b) {
			return false
		}
		for k := range a {
			if !b[k] {
				return false
			}
		}
		return true
	}
	norm := func(v string) string {
		switch strings.ToUpper(v) {
		case "ON", "TRUE":
			return "1"
		case "OFF", "FALSE":
			return "0"
		}
		return v
	}
	return norm(want) == norm(got)
}

func (s *smoke) checkSessionVars() error {
	var problems []string
	got := map[string]string{}
	for name, want := range s.o.session.vars {
		if !identRe.MatchString(name) {
			problems = append(problems, fmt.Sprintf("cannot check variable %q", name))
			continue
		}
		v, err := s.queryString("SELECT @@session." + name)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		got[name] = v
		if !sameSetting(name, want, v) {
			problems = append(problems, fmt.Sprintf("@@session.%s = %q, DSN asked for %q", name, v, want))
		}
	}
	s.info["session_vars"] = got
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func (s *smoke) checkCharset() error {
	for _, v := range []string{"character_set_client", "character_set_connection", "character_set_results"} {
		got, err := s.queryString("SELECT @@session." + v)
		if err != nil {
			return err
		}
		if got != "utf8mb4" {
			return fmt.Errorf("@@%s = %q after SET NAMES utf8mb4", v, got)
		}
	}
	return nil
}

func (s *smoke) exec(q string, args ...interface{}) (sql.Result, error) {
	r, err := s.conn.ExecContext(s.ctx, q, args...)
	if err != nil {
		short := q
		if len(short) > 120 {
			short = short[:120] + "..."
		}
		return nil, fmt.Errorf("%s: %w", short, err)
	}
	return r, nil
}

func (s *smoke) createTables() error {
	stmts := []string{
		"DROP TABLE IF EXISTS " + s.table + ", " + s.big + ", " + s.ai,
		`CREATE TABLE ` + s.table + ` (
			id INT PRIMARY KEY,
			c_int INT NULL,
			c_bigu BIGINT UNSIGNED NULL,
			c_dec DECIMAL(20,6) NULL,
			c_float FLOAT NULL,
			c_double DOUBLE NULL,
			c_varchar VARCHAR(255) NULL,
			c_text TEXT NULL,
			c_blob BLOB NULL,
			c_date DATE NULL,
			c_dt DATETIME(6) NULL,
			c_ts TIMESTAMP NULL DEFAULT NULL,
			c_time TIME NULL,
			c_year YEAR NULL,
			c_json JSON NULL,
			c_enum ENUM('a','b','c') NULL,
			c_bit BIT(8) NULL
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		"CREATE TABLE " + s.big + " (id INT PRIMARY KEY, s LONGTEXT NULL, b LONGBLOB NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
		"CREATE TABLE " + s.ai + " (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
	}
	for _, q := range stmts {
		if _, err := s.exec(q); err != nil {
			return err
		}
	}
	return nil
}

func (s *smoke) dropTables() error {
	_, err := s.exec("DROP TABLE IF EXISTS " + s.table + ", " + s.big + ", " + s.ai)
	return err
}

const typesColumns = "id, c_int, c_bigu, c_dec, c_float, c_double, c_varchar, c_text, c_blob, c_date, c_dt, c_ts, c_time, c_year, c_json, c_enum, c_bit"
const typesPlaceholders = "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"

var binaryColumns = map[int]bool{8: true, 16: true} // c_blob, c_bit: compare as hex

// fullRow returns the arguments of a row with every column set, and the text
// each column must read back as (both protocols, parseTime off like DM).
func fullRow(id int) ([]interface{}, []interface{}) {
	blob := []byte{0, 1, 2, 0xff, '\'', '\\', '"', 0x1a, '\n'}
	args := []interface{}{
		int64(id),
		int32(-123456),
		uint64(18446744073709551615),
		"12345.678901",
		float32(1.5),
		3.141592653589793,
		"héllo wörld ✓ 😀 'q' \"dq\" \\",
		"it's a \"test\" \\ with\nnewline and \x00 nul",
		blob,
		"2024-02-29",
		time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC),
		time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC),
		"-01:02:03",
		int64(2024),
		`{"a": [1, 2, {"b": null}], "s": "x"}`,
		"b",
		int64(5),
	}
	want := []interface{}{
		strconv.Itoa(id), "-123456", "18446744073709551615", "12345.678901", "1.5",
		"3.141592653589793", args[6], args[7], fmt.Sprintf("%x", blob), "2024-02-29",
		"2024-01-02 03:04:05.123456", "2024-01-02 03:04:05", "-01:02:03", "2024",
		args[14], "b", "05",
	}
	return args, want
}

// nullRow returns a row whose columns other than id are all NULL.
func nullRow(id int) ([]interface{}, []interface{}) {
	args := make([]interface{}, 17)
	want := make([]interface{}, 17)
	args[0] = int64(id)
	want[0] = strconv.Itoa(id)
	// Mix the ways a NULL can be passed: untyped nil, nil []byte, sql.Null*.
	args[8] = []byte(nil)
	args[1] = sql.NullInt64{}
	args[6] = sql.NullString{}
	return args, want
}

var smokeRows = []int{1, 2, 3, 4} // 1,2 interpolated; 3,4 prepared; odd = full, even = NULLs

func expectedRow(id int) ([]interface{}, []interface{}) {
	if id%2 == 1 {
		return fullRow(id)
	}
	return nullRow(id)
}

func (s *smoke) insertInterpolated() error {
	for _, id := range []int{1, 2} {
		args, _ := expectedRow(id)
		if _, err := s.exec("INSERT INTO "+s.table+" ("+typesColumns+") VALUES ("+typesPlaceholders+")", args...); err != nil {
			return err
		}
	}
	return nil
}

func (s *smoke) insertPrepared() error {
	stmt, err := s.conn.PrepareContext(s.ctx, "INSERT INTO "+s.table+" ("+typesColumns+") VALUES ("+typesPlaceholders+")")
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	defer stmt.Close()
	for _, id := range []int{3, 4} {
		args, _ := expectedRow(id)
		r, err := stmt.ExecContext(s.ctx, args...)
		if err != nil {
			return fmt.Errorf("execute id=%d: %w", id, err)
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("execute id=%d: rows affected %d, %v", id, n, err)
		}
	}
	return nil
}

// compareRows scans every row of rows and compares it with the expectation.
func compareRows(rows *sql.Rows, ids []int) error {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		if n >= len(ids) {
			return fmt.Errorf("more rows than the expected %d", len(ids))
		}
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]interface{}, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		_, want := expectedRow(ids[n])
		for i, v := range vals {
			got := interface{}(nil)
			if v.Valid {
				if binaryColumns[i] {
					got = fmt.Sprintf("%x", v.String)
				} else {
					got = v.String
				}
			}
			if got != want[i] {
				return fmt.Errorf("row id=%d column %s: got %q, want %q", ids[n], cols[i], got, want[i])
			}
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(ids) {
		return fmt.Errorf("got %d rows, want %d", n, len(ids))
	}
	return nil
}

func (s *smoke) selectText() error {
	rows, err := s.conn.QueryContext(s.ctx, "SELECT "+typesColumns+" FROM "+s.table+" ORDER BY id")
	if err != nil {
		return err
	}
	return compareRows(rows, smokeRows)
}

func (s *smoke) selectPrepared() error {
	stmt, err := s.conn.PrepareContext(s.ctx, "SELECT "+typesColumns+" FROM "+s.table+" WHERE id = ?")
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	defer stmt.Close()
	for _, id := range smokeRows {
		rows, err := stmt.QueryContext(s.ctx, id)
		if err != nil {
			return fmt.Errorf("execute id=%d: %w", id, err)
		}
		if err := compareRows(rows, []int{id}); err != nil {
			return err
		}
	}
	return nil
}

// checkParams echoes one parameter of every kind the driver can send.
func (s *smoke) checkParams(prepared bool) error {
	q := "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?"
	args := []interface{}{
		int64(-42), uint64(18446744073709551615), 2.5, true, false,
		"str'\"\\ é😀", []byte{0, 1, 0xff, '\''},
		time.Date(2023, 12, 31, 23, 59, 58, 0, time.UTC), nil,
	}
	want := []interface{}{"-42", "18446744073709551615", "2.5", "1", "0", args[5],
		string(args[6].([]byte)), "2023-12-31 23:59:58", nil}
	var rows *sql.Rows
	var err error
	if prepared {
		stmt, perr := s.conn.PrepareContext(s.ctx, q)
		if perr != nil {
			return fmt.Errorf("prepare: %w", perr)
		}
		defer stmt.Close()
		rows, err = stmt.QueryContext(s.ctx, args...)
	} else {
		rows, err = s.conn.QueryContext(s.ctx, q, args...)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		return fmt.Errorf("no row: %v", rows.Err())
	}
	vals := make([]sql.NullString, len(args))
	ptrs := make([]interface{}, len(args))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	for i, v := range vals {
		got := interface{}(nil)
		if v.Valid {
			got = v.String
		}
		if got != want[i] {
			return fmt.Errorf("parameter %d (%T): got %q, want %q", i, args[i], got, want[i])
		}
	}
	if rows.Next() {
		return errors.New("more than one row")
	}
	return rows.Err()
}

func (s *smoke) emptyResult() error {
	rows, err := s.conn.QueryContext(s.ctx, "SELECT id FROM "+s.table+" WHERE id < 0")
	if err != nil {
		return err
	}
	defer rows.Close()
	if rows.Next() {
		return errors.New("expected no rows")
	}
	return rows.Err()
}

func (s *smoke) okPacketFields() error {
	r, err := s.exec("INSERT INTO " + s.ai + " (v) VALUES (10), (20), (30)")
	if err != nil {
		return err
	}
	// MySQL reports the first id of a multi-row insert.
	if id, _ := r.LastInsertId(); id != 1 {
		return fmt.Errorf("LastInsertId = %d, want 1", id)
	}
	if n, _ := r.RowsAffected(); n != 3 {
		return fmt.Errorf("RowsAffected = %d, want 3", n)
	}
	r, err = s.exec("UPDATE "+s.ai+" SET v = v + 1 WHERE v >= ?", 20)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n != 2 {
		return fmt.Errorf("UPDATE RowsAffected = %d, want 2", n)
	}
	// Unchanged rows are not counted (no clientFoundRows, as in DM).
	r, err = s.exec("UPDATE "+s.ai+" SET v = 10 WHERE v = ?", 10)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n != 0 {
		return fmt.Errorf("no-op UPDATE RowsAffected = %d, want 0", n)
	}
	return nil
}

func (s *smoke) countIDs(ids ...int) (int, error) {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(id)
	}
	v, err := s.queryString("SELECT COUNT(*) FROM " + s.table + " WHERE id IN (" + strings.Join(parts, ",") + ")")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

func (s *smoke) txnCommit() error {
	tx, err := s.conn.BeginTx(s.ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	for _, id := range []int{10, 11} {
		if _, err := tx.ExecContext(s.ctx, "INSERT INTO "+s.table+" (id, c_int) VALUES (?, ?)", id, id); err != nil {
			tx.Rollback()
			return fmt.Errorf("insert: %w", err)
		}
	}
	// Read-your-writes inside the transaction.
	var n int
	if err := tx.QueryRowContext(s.ctx, "SELECT COUNT(*) FROM "+s.table+" WHERE id IN (10, 11)").Scan(&n); err != nil || n != 2 {
		tx.Rollback()
		return fmt.Errorf("in-transaction count = %d, %v", n, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if n, err := s.countIDs(10, 11); err != nil || n != 2 {
		return fmt.Errorf("after commit: %d of 2 rows, %v", n, err)
	}
	return nil
}

func (s *smoke) txnRollback() error {
	tx, err := s.conn.BeginTx(s.ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if _, err := tx.ExecContext(s.ctx, "INSERT INTO "+s.table+" (id, c_int) VALUES (?, ?)", 20, 20); err != nil {
		tx.Rollback()
		return fmt.Errorf("insert: %w", err)
	}
	if _, err := tx.ExecContext(s.ctx, "UPDATE "+s.table+" SET c_int = c_int + 1 WHERE id = ?", 10); err != nil {
		tx.Rollback()
		return fmt.Errorf("update: %w", err)
	}
	if err := tx.Rollback(); err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	if n, err := s.countIDs(20); err != nil || n != 0 {
		return fmt.Errorf("rolled-back row present: %d, %v", n, err)
	}
	if v, err := s.queryString("SELECT c_int FROM " + s.table + " WHERE id = 10"); err != nil || v != "10" {
		return fmt.Errorf("rolled-back update visible: c_int = %q, %v", v, err)
	}
	return nil
}

func isMySQLError(err error, code uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == code
}

func (s *smoke) dupKeyThenQuery() error {
	_, err := s.conn.ExecContext(s.ctx, "INSERT INTO "+s.table+" (id) VALUES (?)", 1)
	if !isMySQLError(err, 1062) {
		return fmt.Errorf("duplicate insert: want error 1062, got %v", err)
	}
	// Same pinned connection must still work.
	v, err := s.queryString("SELECT 1 + ?", 1)
	if err != nil || v != "2" {
		return fmt.Errorf("query after error: %q, %v", v, err)
	}
	return nil
}

func (s *smoke) dupKeyInTxn() error {
	tx, err := s.conn.BeginTx(s.ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if _, err := tx.ExecContext(s.ctx, "INSERT INTO "+s.table+" (id) VALUES (?)", 30); err != nil {
		tx.Rollback()
		return fmt.Errorf("insert 30: %w", err)
	}
	_, err = tx.ExecContext(s.ctx, "INSERT INTO "+s.table+" (id) VALUES (?)", 1)
	if !isMySQLError(err, 1062) {
		tx.Rollback()
		return fmt.Errorf("duplicate insert in transaction: want error 1062, got %v", err)
	}
	// A statement error does not end the transaction.
	if _, err := tx.ExecContext(s.ctx, "INSERT INTO "+s.table+" (id) VALUES (?)", 31); err != nil {
		tx.Rollback()
		return fmt.Errorf("insert 31 after error: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if n, err := s.countIDs(30, 31); err != nil || n != 2 {
		return fmt.Errorf("after commit: %d of 2 rows, %v", n, err)
	}
	return nil
}

// bigText returns n bytes of valid UTF-8 mixing escapes and multi-byte runes.
func bigText(n int) string {
	const pattern = "abc'\"\\é😀\n\t0123456789"
	var b strings.Builder
	b.Grow(n + len(pattern))
	for b.Len() < n {
		for _, r := range pattern {
			if b.Len()+len(string(r)) > n {
				return b.String() + strings.Repeat("x", n-b.Len())
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

func binaryData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// readBack fetches column col of row id in both protocols and compares it.
func (s *smoke) readBack(col string, id int, want []byte) error {
	wantSum := sha256.Sum256(want)
	check := func(how string, got []byte) error {
		if len(got) != len(want) {
			return fmt.Errorf("%s: read back %d bytes, want %d", how, len(got), len(want))
		}
		if sha256.Sum256(got) != wantSum {
			return fmt.Errorf("%s: content differs", how)
		}
		return nil
	}
	var got []byte
	if err := s.conn.QueryRowContext(s.ctx, "SELECT "+col+" FROM "+s.big+" WHERE id = "+strconv.Itoa(id)).Scan(&got); err != nil {
		return fmt.Errorf("text select: %w", err)
	}
	if err := check("text protocol", got); err != nil {
		return err
	}
	stmt, err := s.conn.PrepareContext(s.ctx, "SELECT "+col+" FROM "+s.big+" WHERE id = ?")
	if err != nil {
		return fmt.Errorf("prepare select: %w", err)
	}
	defer stmt.Close()
	got = nil
	if err := stmt.QueryRowContext(s.ctx, id).Scan(&got); err != nil {
		return fmt.Errorf("prepared select: %w", err)
	}
	if err := check("binary protocol", got); err != nil {
		return err
	}
	var length int
	var hash string
	if err := s.conn.QueryRowContext(s.ctx, "SELECT LENGTH("+col+"), SHA2("+col+", 256) FROM "+s.big+" WHERE id = ?", id).Scan(&length, &hash); err != nil {
		return fmt.Errorf("server-side checksum: %w", err)
	}
	if length != len(want) || hash != fmt.Sprintf("%x", wantSum) {
		return fmt.Errorf("stored value differs: length %d (want %d)", length, len(want))
	}
	return nil
}

func (s *smoke) bigString() error {
	v := bigText(s.o.bigSize)
	if _, err := s.exec("INSERT INTO "+s.big+" (id, s) VALUES (?, ?)", 1, v); err != nil {
		return err
	}
	s.info["big_string_bytes"] = len(v)
	return s.readBack("s", 1, []byte(v))
}

// longDataPrepared sends a parameter just above the driver's long-data
// threshold (max_allowed_packet / (params+1)), so the driver streams it with
// COM_STMT_SEND_LONG_DATA before COM_STMT_EXECUTE.
func (s *smoke) longDataPrepared() error {
	if s.mp == 0 {
		return errors.New("max_allowed_packet unknown")
	}
	size := (s.mp-1)/3 + 1024
	v := binaryData(size)
	stmt, err := s.conn.PrepareContext(s.ctx, "INSERT INTO "+s.big+" (id, b) VALUES (?, ?)")
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	defer stmt.Close()
	if _, err := stmt.ExecContext(s.ctx, 2, v); err != nil {
		return fmt.Errorf("execute with %d-byte parameter: %w", size, err)
	}
	s.info["long_data_bytes"] = size
	return s.readBack("b", 2, v)
}

// sessionStatus reads a session status counter, e.g. Com_stmt_send_long_data,
// to prove which protocol path the driver took.
func (s *smoke) sessionStatus(name string) (int, error) {
	var n string
	var v int
	if err := s.conn.QueryRowContext(s.ctx, "SHOW SESSION STATUS LIKE '"+name+"'").Scan(&n, &v); err != nil {
		return 0, fmt.Errorf("SHOW SESSION STATUS LIKE '%s': %w", name, err)
	}
	return v, nil
}

// withStatusIncrease runs f and fails unless every counter went up. TiDB keeps no such
// counters per session (its SHOW SESSION STATUS has 13 rows, no Com_*): there f runs alone.
func (s *smoke) withStatusIncrease(counters []string, f func() error) error {
	if s.tidb {
		s.info["protocol_counters"] = "none on TiDB"
		return f()
	}
	before := map[string]int{}
	for _, c := range counters {
		v, err := s.sessionStatus(c)
		if err != nil {
			return err
		}
		before[c] = v
	}
	if err := f(); err != nil {
		return err
	}
	for _, c := range counters {
		v, err := s.sessionStatus(c)
		if err != nil {
			return err
		}
		if v <= before[c] {
			return fmt.Errorf("status %s did not increase (%d -> %d): the driver took another protocol path", c, before[c], v)
		}
	}
	return nil
}

// interpolateFallback passes a value that fits max_allowed_packet but whose
// escaped form does not: the driver skips interpolation and falls back to
// prepare + long data + execute + close, as DM does for huge rows.
func (s *smoke) interpolateFallback() error {
	if s.mp == 0 {
		return errors.New("max_allowed_packet unknown")
	}
	size := s.mp / 10 * 6
	v := bytes.Repeat([]byte{'\''}, size) // every byte doubles when escaped
	if _, err := s.exec("INSERT INTO "+s.big+" (id, b) VALUES (?, ?)", 3, v); err != nil {
		return err
	}
	s.info["interpolate_fallback_bytes"] = size
	return s.readBack("b", 3, v)
}
