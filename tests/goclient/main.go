// Command goclient talks to MariaDB/MySQL (directly, or through replay-proxy)
// with go-sql-driver/mysql configured the way TiDB DM configures it, so tests
// see exactly the byte stream DM's DML workers produce.
//
// A Go module (go.mod, go.sum): go-sql-driver/mysql v1.7.1, the version TiDB DM
// v8.5 ships, from the Go module proxy. Build with Go >= 1.26:
//
//	CGO_ENABLED=0 go build -o bin/goclient .
//
// Connection flags (all modes):
//
//	-dsn-host 127.0.0.1  -port 3306  -user root  -password ""  -db test
//	-session k=v         session variable sent by the driver as "SET k=v" right
//	                     after connecting; repeatable. When given at least once
//	                     it replaces the defaults; "-session none" sends none.
//	                     Defaults: sql_mode (MySQL 5.7 default modes),
//	                     time_zone=+00:00, foreign_key_checks=0.
//	-read-timeout 5m     DSN readTimeout (DM uses 5m for DML connections)
//	-write-timeout 0     DSN writeTimeout (0 = none)
//	-connect-timeout 10s DSN timeout (dial timeout)
//	-extra-dsn "a=b&c=d" raw parameters appended to the DSN
//	-tls-ca FILE         connect over TLS, verifying the server against the CA(s) in
//	                     FILE (PEM) and its name against -dsn-host: registered with
//	                     mysql.RegisterTLSConfig("custom", ...), DSN "&tls=custom".
//	                     Default "": no TLS (the DSN has no tls parameter).
//
// The DSN is DM's (dm/pkg/conn/basedb.go):
//
//	user:pw@tcp(host:port)/db?charset=utf8mb4&interpolateParams=true&maxAllowedPacket=0
//	    &readTimeout=..&timeout=..[&writeTimeout=..]&k='url-escaped v'...
//
// One deviation: DM quotes every session value; MariaDB rejects '0' for boolean
// variables (error 1231), so integer values are sent unquoted.
//
// Every mode prints exactly one JSON object on stdout (diagnostics go to
// stderr) and, with -out FILE, also writes it to FILE.
//
// Mode smoke (one pinned *sql.Conn; -big-size N bytes, -long-data=true):
//
//	{"mode": "smoke", "ok": bool, "checks": {"<name>": "ok" | "<error>"},
//	 "info": {"max_allowed_packet": int, "version": str, ...}}
//	Exit status 1 if any check failed.
//
// Mode setup (-table t, -counters-table counters, -conns N):
//
//	drops and recreates
//	  t(id BIGINT PRIMARY KEY, worker INT, seq INT, payload VARCHAR(255))
//	  counters(worker INT PRIMARY KEY, n BIGINT)
//	and inserts counters rows (worker 0..N-1, n=0).
//	{"mode": "setup", "ok": true, "tables": ["t", "counters"]}
//
// Mode workload (-conns N -duration SECONDS -txns PER_WORKER -batch B
// -sql safe|insert -multirow -payload-size P -retry-delay D -grace G):
//
//	N workers, each pinning one *sql.Conn (like DM's DML workers), loop:
//	START TRANSACTION; B row statements; the counter statement; COMMIT.
//	Worker w, transaction seq s (1, 2, ...), row i (0..B-1) writes
//	  id = w*10^12 + s*10^4 + i, worker = w, seq = s, payload = payloadFor(w,s,i,P)
//	-sql safe:   REPLACE INTO t ... (idempotent, DM safe mode), then
//	             UPDATE counters SET n = s WHERE worker = w (idempotent).
//	-sql insert: INSERT INTO t ... (not idempotent), then
//	             UPDATE counters SET n = n + B WHERE worker = w, so applying a
//	             transaction twice is visible.
//	-multirow:   one multi-VALUES statement instead of B single-row ones.
//	On any error the worker does what DM does: ROLLBACK (errors ignored),
//	counts the error, replaces the connection if it is dead, sleeps
//	-retry-delay and retries the same seq. So the transactions the client saw
//	commit are exactly seqs first_seq..last_committed_seq of every worker.
//	A COMMIT that failed leaves its seq "in doubt" (it may have applied). In
//	insert mode the retry resolves that: a duplicate-key error on the first
//	INSERT, or at COMMIT where keys are checked then (TiDB's optimistic
//	transactions), means the earlier COMMIT did apply; the retry committing
//	means it did not (both counted in in_doubt_resolved).
//	A worker starts at seq = 1 + the largest seq already stored for it, and
//	reads its counter first, so several runs can follow one setup.
//	Output (also the expectations file that verify reads):
//	{"mode": "workload", "ok": bool, "sql": "safe"|"insert", "batch": B,
//	 "multirow": bool, "payload_size": P, "table": "t", "counters_table":
//	 "counters", "conns": N, "committed_txns": int, "committed_rows": int,
//	 "errors": {"<phase>: <message>": count}, "error_count": int,
//	 "failed_txns": int, "reconnects": int,
//	 "in_doubt_resolved": {"committed": int, "not_committed": int},
//	 "anomalies": [str], "stuck_workers": int, "stuck_phases": {"<phase>": int},
//	 "stuck": [{"worker", "phase", "seq", "blocked_ms", "txn_age_ms"}],
//	 "grace": seconds, "longest_stall_ms": float,
//	 "stall_ms": {"committed_max", "unfinished_max"},
//	 "unfinished_txns": [{"worker", "seq", "phase", "age_ms", "stuck"}],
//	 "elapsed": seconds, "txns_per_sec": float,
//	 "txn_latency_ms": {"p50", "p95", "p99", "max", "mean"},
//	 "per_worker": {"<w>": {"first_seq": int, "last_committed_seq": int,
//	   "committed_txns": int, "counter_start": int, "counter_expected": int,
//	   "in_doubt_seq": int (0 = none), "errors": int, "failed_txns": int,
//	   "stuck": bool, "stuck_phase": str}}}
//	<phase> is connect, begin, dml, commit or ping. error_count counts error
//	events: every failed attempt of anything, so a server that refuses
//	connects for a second costs about ten connect errors per worker (one per
//	-retry-delay). failed_txns counts what a replicator would see fail:
//	transaction attempts (BEGIN .. COMMIT) that ended in an error, plus those
//	stuck inside one at the end.
//	A worker still waiting for the server (phase connect, start, begin, dml,
//	commit, rollback or ping) -grace after the deadline is stuck: counted in
//	stuck_workers and stuck_phases, listed in stuck (blocked_ms: in that
//	phase; txn_age_ms: since its transaction's first attempt), added to
//	errors as "stuck: <phase>: ..." and error_count, and ok is false. A
//	session held without end is a failure, not a quiet run.
//	counter_expected is the counter's absolute expected value: insert mode
//	counter_start + B per committed seq; safe mode last_committed_seq.
//	txn_latency_ms covers successful attempts only (BEGIN to COMMIT).
//	longest_stall_ms is the longest a transaction waited to commit: from its
//	first attempt to its COMMIT (retries included) for committed ones
//	(stall_ms.committed_max), and from its first attempt to the end for the
//	ones never committed (stall_ms.unfinished_max; listed in unfinished_txns:
//	a worker that gave up at the deadline, or a stuck one).
//	ok is false when a worker is stuck, when anomalies is non-empty (e.g.
//	rows of a seq the client never committed were already present) or a
//	worker could not start; other errors do not make ok false.
//	Exit status 1 if ok is false.
//
// Mode verify (-expect FILE, the workload output):
//
//	For every worker: each seq in first_seq..last_committed_seq has exactly B
//	rows with the right ids and payloads; in_doubt_seq has all B rows or none;
//	no other rows with seq >= first_seq exist; the counter equals
//	counter_expected (insert mode: + B if the in-doubt seq applied; safe mode:
//	in_doubt_seq if it applied). Workload anomalies are reported as problems.
//	Check the latest workload run: rows of a later run count as unexpected.
//	{"mode": "verify", "ok": bool, "checked_workers": int,
//	 "checked_rows": int, "problem_count": int, "problems": [str] (first 100)}
//	Exit status 1 if ok is false.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// sessionFlag collects repeated -session k=v flags.
type sessionFlag struct {
	set  bool
	vars map[string]string
}

func (s *sessionFlag) String() string { return fmt.Sprint(s.vars) }

func (s *sessionFlag) Set(v string) error {
	if !s.set {
		// First explicit -session replaces the defaults.
		s.set = true
		s.vars = map[string]string{}
	}
	if v == "none" {
		return nil
	}
	i := strings.IndexByte(v, '=')
	if i <= 0 {
		return fmt.Errorf("want k=v, got %q", v)
	}
	s.vars[v[:i]] = v[i+1:]
	return nil
}

type options struct {
	host, user, password, db string
	port                     int
	session                  sessionFlag
	readTimeout              time.Duration
	writeTimeout             time.Duration
	connectTimeout           time.Duration
	extraDSN                 string
	tlsCA                    string
	mode                     string
	out                      string

	// exec
	exec stringsFlag

	// smoke
	bigSize  int
	longData bool

	// setup / workload / verify
	table         string
	countersTable string
	conns         int
	duration      float64
	txns          int
	batch         int
	rate          float64
	sqlMode       string
	multirow      bool
	payloadSize   int
	retryDelay    time.Duration
	grace         time.Duration
	expect        string
}

const defaultSQLMode = "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE," +
	"ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION"

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
var intRe = regexp.MustCompile(`^-?[0-9]+$`)

func parseFlags() *options {
	o := &options{}
	o.session.vars = map[string]string{
		"sql_mode":           defaultSQLMode,
		"time_zone":          "+00:00",
		"foreign_key_checks": "0",
	}
	flag.StringVar(&o.host, "dsn-host", "127.0.0.1", "server host")
	flag.IntVar(&o.port, "port", 3306, "server port")
	flag.StringVar(&o.user, "user", "root", "user")
	flag.StringVar(&o.password, "password", "", "password")
	flag.StringVar(&o.db, "db", "test", "default database (empty: none, as DM)")
	flag.Var(&o.session, "session", "session variable k=v (repeatable; 'none' for no variables)")
	flag.DurationVar(&o.readTimeout, "read-timeout", 5*time.Minute, "DSN readTimeout")
	flag.DurationVar(&o.writeTimeout, "write-timeout", 0, "DSN writeTimeout (0 = none)")
	flag.DurationVar(&o.connectTimeout, "connect-timeout", 10*time.Second, "DSN timeout (dial)")
	flag.StringVar(&o.extraDSN, "extra-dsn", "", "raw DSN parameters to append, e.g. a=b&c=d")
	flag.StringVar(&o.tlsCA, "tls-ca", "", "PEM CA file: connect over TLS (tls=custom), verifying the server")
	flag.StringVar(&o.mode, "mode", "smoke", "smoke | setup | workload | verify | exec")
	flag.Var(&o.exec, "exec", "exec: a statement to run (repeatable, in order, on one connection)")
	flag.StringVar(&o.out, "out", "", "also write the JSON result to this file")
	flag.IntVar(&o.bigSize, "big-size", 1<<20, "smoke: size of the big string round trip")
	flag.BoolVar(&o.longData, "long-data", true, "smoke: run the COM_STMT_SEND_LONG_DATA checks (sized from max_allowed_packet)")
	flag.StringVar(&o.table, "table", "t", "workload table")
	flag.StringVar(&o.countersTable, "counters-table", "counters", "counters table")
	flag.IntVar(&o.conns, "conns", 4, "workers (pinned connections)")
	flag.Float64Var(&o.duration, "duration", 5, "seconds to run the workload")
	flag.IntVar(&o.txns, "txns", 0, "stop each worker after this many committed transactions (0 = no limit)")
	flag.IntVar(&o.batch, "batch", 10, "rows per transaction")
	flag.Float64Var(&o.rate, "rate", 0, "workload: transactions per second offered, all workers together (0 = each as fast as it can)")
	flag.StringVar(&o.sqlMode, "sql", "safe", "safe (REPLACE) | insert (INSERT + counter)")
	flag.BoolVar(&o.multirow, "multirow", false, "one multi-VALUES statement per transaction")
	flag.IntVar(&o.payloadSize, "payload-size", 64, "payload length (<= 255)")
	flag.DurationVar(&o.retryDelay, "retry-delay", 100*time.Millisecond, "sleep before retrying a failed transaction")
	flag.DurationVar(&o.grace, "grace", 30*time.Second, "after -duration, wait this long for workers still waiting for the server; those still waiting then are stuck (an error, ok false)")
	flag.StringVar(&o.expect, "expect", "", "verify: workload JSON output to check against")
	flag.Parse()
	if flag.NArg() != 0 {
		fatalf("unexpected arguments: %v", flag.Args())
	}
	for _, name := range []string{o.table, o.countersTable} {
		if !identRe.MatchString(name) {
			fatalf("bad table name %q", name)
		}
	}
	if o.tlsCA != "" {
		registerTLS(o.tlsCA)
	}
	return o
}

// registerTLS registers the "custom" TLS config: the server must present a certificate
// signed by a CA in caFile (the driver checks its name against the DSN's host).
func registerTLS(caFile string) {
	pem, err := ioutil.ReadFile(caFile)
	if err != nil {
		fatalf("reading -tls-ca: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		fatalf("-tls-ca %s: no PEM certificate found", caFile)
	}
	if err := mysql.RegisterTLSConfig("custom", &tls.Config{RootCAs: pool}); err != nil {
		fatalf("registering the TLS config: %v", err)
	}
}

func fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "goclient: "+format+"\n", args...)
	os.Exit(2)
}

// dsn builds the DM-style DSN.
func (o *options) dsn() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%s@tcp(%s)/%s?charset=utf8mb4&interpolateParams=true&maxAllowedPacket=0",
		o.user, o.password, net.JoinHostPort(o.host, strconv.Itoa(o.port)), o.db)
	fmt.Fprintf(&b, "&readTimeout=%s&timeout=%s", o.readTimeout, o.connectTimeout)
	if o.writeTimeout > 0 {
		fmt.Fprintf(&b, "&writeTimeout=%s", o.writeTimeout)
	}
	if o.tlsCA != "" {
		b.WriteString("&tls=custom")
	}
	keys := make([]string, 0, len(o.session.vars))
	for k := range o.session.vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := o.session.vars[k]
		if intRe.MatchString(v) {
			fmt.Fprintf(&b, "&%s=%s", k, v)
		} else {
			fmt.Fprintf(&b, "&%s='%s'", k, url.QueryEscape(v))
		}
	}
	if o.extraDSN != "" {
		b.WriteString("&" + strings.TrimPrefix(o.extraDSN, "&"))
	}
	return b.String()
}

func (o *options) openDB(maxConns int) *sql.DB {
	db, err := sql.Open("mysql", o.dsn())
	if err != nil {
		fatalf("bad DSN: %v", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return db
}

func emit(o *options, result interface{}) {
	data, err := json.MarshalIndent(result, "", "  ")
	if err != nil {
		fatalf("encoding result: %v", err)
	}
	data = append(data, '\n')
	os.Stdout.Write(data)
	if o.out != "" {
		if err := ioutil.WriteFile(o.out, data, 0o644); err != nil {
			fatalf("writing %s: %v", o.out, err)
		}
	}
}

type driverLogger struct{}

func (driverLogger) Print(v ...interface{}) {
	fmt.Fprintln(os.Stderr, append([]interface{}{"[mysql driver]"}, v...)...)
}

func main() {
	o := parseFlags()
	mysql.SetLogger(driverLogger{})
	var ok bool
	switch o.mode {
	case "smoke":
		ok = runSmoke(o)
	case "setup":
		ok = runSetup(o)
	case "workload":
		ok = runWorkload(o)
	case "verify":
		ok = runVerify(o)
	case "exec":
		ok = runExec(o)
	default:
		fatalf("unknown -mode %q (want smoke, setup, workload, verify or exec)", o.mode)
	}
	if !ok {
		os.Exit(1)
	}
}
