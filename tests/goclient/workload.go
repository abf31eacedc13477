package main

// Modes setup and workload: a DM-like replication load with a deterministic
// expected outcome. Format and semantics are documented in main.go.

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	maxBatch = 10000
	seqLimit = 100000000 // ids are w*10^12 + seq*10^4 + i
)

func rowID(worker, seq, i int) int64 {
	return int64(worker)*1000000000000 + int64(seq)*10000 + int64(i)
}

// payloadFor is deterministic so verify can recompute it; the filler has
// quotes and a backslash so interpolation escaping is exercised.
func payloadFor(worker, seq, i, size int) string {
	// Exactly max(size, len(prefix)) bytes.
	prefix := fmt.Sprintf("w%d s%d i%d ", worker, seq, i)
	if len(prefix) >= size {
		return prefix
	}
	const filler = "abc'def\"ghi\\jkl "
	p := prefix + strings.Repeat(filler, (size-len(prefix))/len(filler)+1)
	return p[:size]
}

func runSetup(o *options) bool {
	db := o.openDB(1)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.connectTimeout+60*time.Second)
	defer cancel()
	stmts := []string{
		"DROP TABLE IF EXISTS " + o.table + ", " + o.countersTable,
		"CREATE TABLE " + o.table + " (id BIGINT PRIMARY KEY, worker INT NOT NULL, seq INT NOT NULL, " +
			"payload VARCHAR(255) NOT NULL, KEY worker_seq (worker, seq)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
		"CREATE TABLE " + o.countersTable + " (worker INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB",
	}
	if o.conns > 0 {
		values := make([]string, o.conns)
		for w := range values {
			values[w] = fmt.Sprintf("(%d, 0)", w)
		}
		stmts = append(stmts, "INSERT INTO "+o.countersTable+" (worker, n) VALUES "+strings.Join(values, ", "))
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			emit(o, map[string]interface{}{"mode": "setup", "ok": false, "error": fmt.Sprintf("%s: %v", q, err)})
			return false
		}
	}
	emit(o, map[string]interface{}{"mode": "setup", "ok": true, "tables": []string{o.table, o.countersTable}})
	return true
}

// workerState is read by main when a worker is stuck past the grace period,
// so every field is guarded by mu.
type workerState struct {
	mu              sync.Mutex
	FirstSeq        int
	LastCommitted   int
	CommittedTxns   int
	CounterStart    int64
	CounterExpected int64
	InDoubtSeq      int
	Errors          int
	FailedTxns      int
	Stuck           bool
	StuckPhase      string
	StartError      string

	seq        int       // seq being attempted
	inDoubt    bool      // a COMMIT of seq failed: it may have applied
	phase      string    // current phase, for stuck workers
	phaseSince time.Time // when phase began
	seqStart   time.Time // first attempt of seq began (zero: no attempt of it yet)
	endedAt    time.Time // runWorker returned (zero: still running)
	stmtMs     []float64 // the statements of the attempt under way, each timed
}

type workload struct {
	o        *options
	db       *sql.DB
	deadline time.Time

	mu                sync.Mutex
	errors            map[string]int
	errorCount        int
	failedTxns        int
	reconnects        int
	maxStallMs        float64 // longest first attempt -> COMMIT of a committed seq
	resolvedCommitted int
	resolvedNot       int
	anomalies         []string
	latencies         []float64
	stmtLatencies     []float64 // each statement of a committed transaction: BEGIN, the writes, COMMIT
}

func (wl *workload) recordError(ws *workerState, phase string, err error) {
	msg := phase + ": " + err.Error()
	wl.mu.Lock()
	wl.errors[msg]++
	wl.errorCount++
	wl.mu.Unlock()
	ws.mu.Lock()
	ws.Errors++
	ws.mu.Unlock()
}

func (wl *workload) anomaly(format string, args ...interface{}) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "workload anomaly:", msg)
	wl.mu.Lock()
	wl.anomalies = append(wl.anomalies, msg)
	wl.mu.Unlock()
}

func (wl *workload) expired() bool { return !time.Now().Before(wl.deadline) }

// connect pins a new connection, retrying until the deadline like DM's
// reset of a dead DML connection.
func (wl *workload) connect(ws *workerState) (*sql.Conn, error) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), wl.o.connectTimeout+5*time.Second)
		conn, err := wl.db.Conn(ctx)
		if err == nil {
			err = conn.PingContext(ctx)
			if err != nil {
				conn.Close()
			}
		}
		cancel()
		if err == nil {
			return conn, nil
		}
		wl.recordError(ws, "connect", err)
		if wl.expired() {
			return nil, err
		}
		time.Sleep(wl.o.retryDelay)
	}
}

func (wl *workload) runWorker(w int, ws *workerState) {
	o := wl.o
	ctx := context.Background()
	ws.setPhase("connect")
	conn, err := wl.connect(ws)
	if err != nil {
		ws.mu.Lock()
		ws.StartError = err.Error()
		ws.mu.Unlock()
		wl.anomaly("worker %d could not connect: %v", w, err)
		return
	}
	defer func() {
		if conn != nil { // nil when the server stayed unreachable past the deadline
			conn.Close()
		}
	}()

	// Resume after earlier runs; the counter row may not exist if setup ran
	// with fewer workers.
	ws.setPhase("start")
	var maxSeq int
	var counter int64
	err = conn.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM "+o.table+" WHERE worker = ?", w).Scan(&maxSeq)
	if err == nil {
		err = conn.QueryRowContext(ctx, "SELECT n FROM "+o.countersTable+" WHERE worker = ?", w).Scan(&counter)
	}
	if err == sql.ErrNoRows {
		// Setup made a row per worker it knew of; only a worker beyond those writes one here (a
		// write a restart may catch in flight: the proxy then rightly answers 1158).
		_, err = conn.ExecContext(ctx, "INSERT IGNORE INTO "+o.countersTable+" (worker, n) VALUES (?, 0)", w)
	}
	if err != nil {
		ws.mu.Lock()
		ws.StartError = err.Error()
		ws.mu.Unlock()
		wl.anomaly("worker %d could not read its start position: %v", w, err)
		return
	}
	ws.mu.Lock()
	ws.FirstSeq = maxSeq + 1
	ws.LastCommitted = maxSeq
	ws.seq = maxSeq + 1
	ws.CounterStart = counter
	ws.CounterExpected = counter
	if o.sqlMode == "safe" {
		ws.CounterExpected = int64(maxSeq)
	}
	ws.mu.Unlock()

	// -rate: this worker's share of the offered load, on a fixed schedule (a late
	// transaction does not push the next ones back, as a steady upstream would not).
	var interval time.Duration
	next := time.Now()
	if o.rate > 0 {
		interval = time.Duration(float64(o.conns) / o.rate * float64(time.Second))
		next = next.Add(time.Duration(w) * interval / time.Duration(o.conns))
	}
	for {
		if interval > 0 {
			if wait := time.Until(next); wait > 0 {
				time.Sleep(wait)
			}
			next = next.Add(interval)
		}
		ws.mu.Lock()
		seq := ws.seq
		committed := ws.CommittedTxns
		ws.mu.Unlock()
		if wl.expired() || (o.txns > 0 && committed >= o.txns) {
			return
		}
		if seq >= seqLimit {
			wl.anomaly("worker %d reached seq limit %d", w, seqLimit)
			return
		}
		start := time.Now()
		ws.mu.Lock()
		if ws.seqStart.IsZero() {
			ws.seqStart = start
		}
		ws.mu.Unlock()
		phase, err := wl.attempt(ctx, conn, w, seq, ws)
		if err == nil {
			ms := float64(time.Since(start).Microseconds()) / 1000
			wl.mu.Lock()
			wl.latencies = append(wl.latencies, ms)
			wl.stmtLatencies = append(wl.stmtLatencies, ws.stmtMs...)
			wl.mu.Unlock()
			continue
		}
		if phase == "resolved" {
			continue
		}
		wl.recordError(ws, phase, err)
		wl.mu.Lock()
		wl.failedTxns++
		wl.mu.Unlock()
		ws.mu.Lock()
		ws.FailedTxns++
		ws.mu.Unlock()
		// DM re-checks the connection and replaces it when it is dead.
		ws.setPhase("ping")
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		perr := conn.PingContext(pctx)
		cancel()
		if perr != nil {
			conn.Close()
			wl.mu.Lock()
			wl.reconnects++
			wl.mu.Unlock()
			ws.setPhase("sleep")
			time.Sleep(o.retryDelay)
			ws.setPhase("connect")
			conn, err = wl.connect(ws)
			if err != nil {
				return // deadline passed while the server was unreachable
			}
			continue
		}
		ws.setPhase("sleep")
		time.Sleep(o.retryDelay)
	}
}

func (ws *workerState) setPhase(p string) {
	ws.mu.Lock()
	ws.phase = p
	ws.phaseSince = time.Now()
	ws.mu.Unlock()
}

// rollback is tx.Rollback under its own phase: it waits for the server too.
func rollback(ws *workerState, tx *sql.Tx) {
	ws.setPhase("rollback")
	tx.Rollback()
}

// attempt runs transaction seq once. On success it advances the worker. It
// returns the phase an error happened in; phase "resolved" means the
// transaction turned out to be applied by an earlier attempt.
func (wl *workload) attempt(ctx context.Context, conn *sql.Conn, w, seq int, ws *workerState) (string, error) {
	o := wl.o
	ws.stmtMs = ws.stmtMs[:0]
	timed := func(since time.Time) {
		ws.stmtMs = append(ws.stmtMs, float64(time.Since(since).Microseconds())/1000)
	}
	ws.setPhase("begin")
	began := time.Now()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return "begin", err
	}
	timed(began)
	ws.setPhase("dml")
	verb := "REPLACE"
	if o.sqlMode == "insert" {
		verb = "INSERT"
	}
	prefix := verb + " INTO " + o.table + " (id, worker, seq, payload) VALUES "
	var stmts []string
	var stmtArgs [][]interface{}
	if o.multirow {
		var ph []string
		var args []interface{}
		for i := 0; i < o.batch; i++ {
			ph = append(ph, "(?, ?, ?, ?)")
			args = append(args, rowID(w, seq, i), w, seq, payloadFor(w, seq, i, o.payloadSize))
		}
		stmts = append(stmts, prefix+strings.Join(ph, ", "))
		stmtArgs = append(stmtArgs, args)
	} else {
		for i := 0; i < o.batch; i++ {
			stmts = append(stmts, prefix+"(?, ?, ?, ?)")
			stmtArgs = append(stmtArgs, []interface{}{rowID(w, seq, i), w, seq, payloadFor(w, seq, i, o.payloadSize)})
		}
	}
	ws.mu.Lock()
	inDoubt := ws.inDoubt
	ws.mu.Unlock()
	for k, q := range stmts {
		sent := time.Now()
		_, err := tx.ExecContext(ctx, q, stmtArgs[k]...)
		timed(sent)
		if err != nil {
			rollback(ws, tx)
			if k == 0 && o.sqlMode == "insert" && isMySQLError(err, 1062) {
				// The rows exist already: an earlier COMMIT of seq applied.
				if !inDoubt {
					wl.anomaly("worker %d seq %d: rows already present although no COMMIT of it could have applied (%v)", w, seq, err)
				}
				wl.mu.Lock()
				wl.resolvedCommitted++
				wl.mu.Unlock()
				wl.markCommitted(ws, seq, int64(o.batch), o.sqlMode)
				return "resolved", err
			}
			return "dml", err
		}
	}
	if o.sqlMode == "insert" {
		r, err := tx.ExecContext(ctx, "UPDATE "+o.countersTable+" SET n = n + ? WHERE worker = ?", o.batch, w)
		if err != nil {
			rollback(ws, tx)
			return "dml", err
		}
		if n, _ := r.RowsAffected(); n != 1 {
			wl.anomaly("worker %d seq %d: counter UPDATE affected %d rows, want 1", w, seq, n)
		}
	} else {
		// Idempotent: no affected-rows check, a re-run changes nothing.
		sent := time.Now()
		if _, err := tx.ExecContext(ctx, "UPDATE "+o.countersTable+" SET n = ? WHERE worker = ?", seq, w); err != nil {
			rollback(ws, tx)
			return "dml", err
		}
		timed(sent)
	}
	ws.setPhase("commit")
	sent := time.Now()
	err = tx.Commit()
	timed(sent)
	if err != nil {
		if o.sqlMode == "insert" && isMySQLError(err, 1062) {
			// Keys checked at COMMIT (TiDB's optimistic transactions): the rows exist already.
			if !inDoubt {
				wl.anomaly("worker %d seq %d: rows already present at COMMIT although no COMMIT of it could have applied (%v)", w, seq, err)
				return "commit", err
			}
			wl.mu.Lock()
			wl.resolvedCommitted++
			wl.mu.Unlock()
			wl.markCommitted(ws, seq, int64(o.batch), o.sqlMode)
			return "resolved", err
		}
		ws.mu.Lock()
		ws.inDoubt = true
		ws.mu.Unlock()
		return "commit", err
	}
	if inDoubt && o.sqlMode == "insert" {
		// The same rows committed now, so the failed COMMIT had not applied (it would have
		// made this one fail with 1062, at its INSERT or at its COMMIT).
		wl.mu.Lock()
		wl.resolvedNot++
		wl.mu.Unlock()
	}
	wl.markCommitted(ws, seq, int64(o.batch), o.sqlMode)
	return "", nil
}

func (wl *workload) markCommitted(ws *workerState, seq int, rows int64, sqlMode string) {
	ws.mu.Lock()
	stall := float64(time.Since(ws.seqStart).Microseconds()) / 1000
	ws.seqStart = time.Time{}
	ws.LastCommitted = seq
	ws.CommittedTxns++
	if sqlMode == "insert" {
		ws.CounterExpected += rows
	} else {
		ws.CounterExpected = int64(seq)
	}
	ws.seq = seq + 1
	ws.inDoubt = false
	ws.phase = "idle"
	ws.phaseSince = time.Now()
	ws.mu.Unlock()
	wl.mu.Lock()
	if stall > wl.maxStallMs {
		wl.maxStallMs = stall
	}
	wl.mu.Unlock()
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

func runWorkload(o *options) bool {
	if o.sqlMode != "safe" && o.sqlMode != "insert" {
		fatalf("-sql must be safe or insert, got %q", o.sqlMode)
	}
	if o.batch < 1 || o.batch > maxBatch {
		fatalf("-batch must be in 1..%d", maxBatch)
	}
	if o.conns < 1 {
		fatalf("-conns must be >= 1")
	}
	if o.payloadSize < 1 || o.payloadSize > 255 {
		fatalf("-payload-size must be in 1..255")
	}
	wl := &workload{
		o:        o,
		db:       o.openDB(o.conns + 1),
		deadline: time.Now().Add(time.Duration(o.duration * float64(time.Second))),
		errors:   map[string]int{},
	}
	defer wl.db.Close()

	states := make([]*workerState, o.conns)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range states {
		states[w] = &workerState{phase: "connect", phaseSince: start}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			defer func() {
				ws := states[w]
				ws.mu.Lock()
				ws.phase = "done"
				ws.endedAt = time.Now()
				ws.mu.Unlock()
			}()
			wl.runWorker(w, states[w])
		}(w)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	stuck := 0
	stuckPhases := map[string]int{}
	stuckList := []map[string]interface{}{}
	select {
	case <-done:
	case <-time.After(time.Until(wl.deadline) + o.grace):
		// A worker still waiting for the server now is stuck: an error, and the
		// run is not ok (a session held without end must not pass for "no client
		// error"). One blocked in COMMIT leaves its seq in doubt; one blocked
		// earlier cannot commit once we exit.
		now := time.Now()
		for w, ws := range states {
			ws.mu.Lock()
			if blockingPhases[ws.phase] {
				ws.Stuck = true
				ws.StuckPhase = ws.phase
				stuck++
				stuckPhases[ws.phase]++
				if ws.phase == "commit" {
					ws.inDoubt = true
				}
				entry := map[string]interface{}{
					"worker":     w,
					"phase":      ws.phase,
					"seq":        ws.seq,
					"blocked_ms": round3(float64(now.Sub(ws.phaseSince).Microseconds()) / 1000),
				}
				if !ws.seqStart.IsZero() {
					entry["txn_age_ms"] = round3(float64(now.Sub(ws.seqStart).Microseconds()) / 1000)
				}
				stuckList = append(stuckList, entry)
			}
			ws.mu.Unlock()
		}
		fmt.Fprintf(os.Stderr, "workload: %d workers still blocked %s after the deadline: %v\n", stuck, o.grace, stuckPhases)
	}
	end := time.Now()
	elapsed := end.Sub(start).Seconds()

	// Snapshot under each worker's lock: a stuck worker may still run.
	perWorker := map[string]interface{}{}
	committedTxns := 0
	stuckTxns := 0
	ok := stuck == 0
	unfinished := []map[string]interface{}{}
	unfinishedMax := 0.0
	for w, ws := range states {
		ws.mu.Lock()
		if ws.inDoubt {
			ws.InDoubtSeq = ws.seq
		}
		if ws.StartError != "" {
			ok = false
		}
		if ws.Stuck && inTxnPhases[ws.StuckPhase] {
			stuckTxns++ // stuck inside an attempt: not yet counted as failed
		}
		if !ws.seqStart.IsZero() {
			// A transaction begun and never committed: its stall lasts until the
			// worker gave up (the deadline passed) or, stuck, until now.
			until := ws.endedAt
			if until.IsZero() {
				until = end
			}
			age := float64(until.Sub(ws.seqStart).Microseconds()) / 1000
			if age > unfinishedMax {
				unfinishedMax = age
			}
			unfinished = append(unfinished, map[string]interface{}{
				"worker": w, "seq": ws.seq, "phase": ws.phase, "age_ms": round3(age), "stuck": ws.Stuck,
			})
		}
		committedTxns += ws.CommittedTxns
		perWorker[strconv.Itoa(w)] = map[string]interface{}{
			"first_seq":          ws.FirstSeq,
			"last_committed_seq": ws.LastCommitted,
			"committed_txns":     ws.CommittedTxns,
			"counter_start":      ws.CounterStart,
			"counter_expected":   ws.CounterExpected,
			"in_doubt_seq":       ws.InDoubtSeq,
			"errors":             ws.Errors,
			"failed_txns":        ws.FailedTxns,
			"stuck":              ws.Stuck,
			"stuck_phase":        ws.StuckPhase,
			"start_error":        ws.StartError,
		}
		ws.mu.Unlock()
	}

	wl.mu.Lock()
	defer wl.mu.Unlock()
	// Stuck workers are errors: in the error map (one entry per phase), the
	// error count and the failed transactions (those stuck inside one).
	for phase, n := range stuckPhases {
		wl.errors[fmt.Sprintf("stuck: %s: still waiting for the server %s after the deadline", phase, o.grace)] += n
		wl.errorCount += n
	}
	if len(wl.anomalies) > 0 {
		ok = false
	}
	lat := append([]float64(nil), wl.latencies...)
	sort.Float64s(lat)
	stmtLat := append([]float64(nil), wl.stmtLatencies...)
	sort.Float64s(stmtLat)
	mean := 0.0
	for _, v := range lat {
		mean += v
	}
	if len(lat) > 0 {
		mean /= float64(len(lat))
	}
	anomalies := wl.anomalies
	if anomalies == nil {
		anomalies = []string{}
	}
	result := map[string]interface{}{
		"mode":           "workload",
		"ok":             ok,
		"sql":            o.sqlMode,
		"batch":          o.batch,
		"multirow":       o.multirow,
		"payload_size":   o.payloadSize,
		"table":          o.table,
		"counters_table": o.countersTable,
		"conns":          o.conns,
		"committed_txns": committedTxns,
		"committed_rows": committedTxns * o.batch,
		"errors":         wl.errors,
		"error_count":    wl.errorCount,
		"failed_txns":    wl.failedTxns + stuckTxns,
		"reconnects":     wl.reconnects,
		"in_doubt_resolved": map[string]int{
			"committed":     wl.resolvedCommitted,
			"not_committed": wl.resolvedNot,
		},
		"anomalies":        anomalies,
		"stuck_workers":    stuck,
		"stuck_phases":     stuckPhases,
		"stuck":            stuckList,
		"grace":            o.grace.Seconds(),
		"longest_stall_ms": round3(math.Max(wl.maxStallMs, unfinishedMax)),
		"stall_ms": map[string]float64{
			"committed_max":  round3(wl.maxStallMs),
			"unfinished_max": round3(unfinishedMax),
		},
		"unfinished_txns": unfinished,
		"elapsed":         round3(elapsed),
		"txns_per_sec":    round3(float64(committedTxns) / elapsed),
		"txn_latency_ms": map[string]float64{
			"p50":  round3(percentile(lat, 50)),
			"p95":  round3(percentile(lat, 95)),
			"p99":  round3(percentile(lat, 99)),
			"max":  round3(percentile(lat, 100)),
			"mean": round3(mean),
		},
		"stmt_latency_ms": map[string]float64{
			"p50": round3(percentile(stmtLat, 50)),
			"p99": round3(percentile(stmtLat, 99)),
			"max": round3(percentile(stmtLat, 100)),
		},
		"offered_rate": o.rate,
		"per_worker":   perWorker,
	}
	emit(o, result)
	return ok
}

// blockingPhases are the phases in which a worker waits for the server; one
// still in one of them after the deadline + grace is stuck.
var blockingPhases = map[string]bool{
	"connect": true, "start": true, "begin": true, "dml": true, "commit": true, "rollback": true, "ping": true,
}

// inTxnPhases are those of a transaction attempt.
var inTxnPhases = map[string]bool{"begin": true, "dml": true, "commit": true, "rollback": true}
