package main

// Mode verify: compare the tables with a workload's JSON output. Rules are
// documented in main.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"sort"
	"strconv"
	"time"
)

type workerExpectation struct {
	FirstSeq        int    `json:"first_seq"`
	LastCommitted   int    `json:"last_committed_seq"`
	CounterExpected int64  `json:"counter_expected"`
	InDoubtSeq      int    `json:"in_doubt_seq"`
	StartError      string `json:"start_error"`
}

type expectation struct {
	Mode          string                       `json:"mode"`
	SQL           string                       `json:"sql"`
	Batch         int                          `json:"batch"`
	PayloadSize   int                          `json:"payload_size"`
	Table         string                       `json:"table"`
	CountersTable string                       `json:"counters_table"`
	Anomalies     []string                     `json:"anomalies"`
	PerWorker     map[string]workerExpectation `json:"per_worker"`
}

const maxReportedProblems = 100

type verifier struct {
	problems     []string
	problemCount int
}

func (v *verifier) problem(format string, args ...interface{}) {
	v.problemCount++
	if len(v.problems) < maxReportedProblems {
		v.problems = append(v.problems, fmt.Sprintf(format, args...))
	}
}

func runVerify(o *options) bool {
	v := &verifier{}
	result := map[string]interface{}{"mode": "verify"}
	finish := func(workers, rows int) bool {
		ok := v.problemCount == 0
		problems := v.problems
		if problems == nil {
			problems = []string{}
		}
		result["ok"] = ok
		result["checked_workers"] = workers
		result["checked_rows"] = rows
		result["problem_count"] = v.problemCount
		result["problems"] = problems
		emit(o, result)
		return ok
	}

	if o.expect == "" {
		fatalf("-mode verify needs -expect FILE (a workload's JSON output)")
	}
	data, err := ioutil.ReadFile(o.expect)
	if err != nil {
		fatalf("reading expectations: %v", err)
	}
	var e expectation
	if err := json.Unmarshal(data, &e); err != nil {
		fatalf("parsing expectations %s: %v", o.expect, err)
	}
	if e.Mode != "workload" || e.Batch < 1 || (e.SQL != "safe" && e.SQL != "insert") ||
		!identRe.MatchString(e.Table) || !identRe.MatchString(e.CountersTable) {
		fatalf("%s is not a workload result (mode %q, sql %q, batch %d, tables %q/%q)",
			o.expect, e.Mode, e.SQL, e.Batch, e.Table, e.CountersTable)
	}
	for _, a := range e.Anomalies {
		v.problem("workload anomaly: %s", a)
	}

	db := o.openDB(1)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.connectTimeout+5*time.Minute)
	defer cancel()

	workers := make([]int, 0, len(e.PerWorker))
	for k := range e.PerWorker {
		w, err := strconv.Atoi(k)
		if err != nil {
			fatalf("bad worker key %q in %s", k, o.expect)
		}
		workers = append(workers, w)
	}
	sort.Ints(workers)

	checkedRows := 0
	for _, w := range workers {
		we := e.PerWorker[strconv.Itoa(w)]
		if we.StartError != "" {
			v.problem("worker %d never started: %s", w, we.StartError)
			continue
		}
		rows, err := db.QueryContext(ctx, "SELECT id, seq, payload FROM "+e.Table+
			" WHERE worker = ? AND seq >= ? ORDER BY id", w, we.FirstSeq)
		if err != nil {
			v.problem("worker %d: reading rows: %v", w, err)
			return finish(len(workers), checkedRows)
		}
		counts := map[int]int{}
		for rows.Next() {
			var id int64
			var seq int
			var payload string
			if err := rows.Scan(&id, &seq, &payload); err != nil {
				rows.Close()
				v.problem("worker %d: scan: %v", w, err)
				return finish(len(workers), checkedRows)
			}
			checkedRows++
			i := int(id - rowID(w, seq, 0))
			if i < 0 || i >= e.Batch {
				v.problem("worker %d seq %d: unexpected id %d", w, seq, id)
				continue
			}
			if want := payloadFor(w, seq, i, e.PayloadSize); payload != want {
				v.problem("worker %d seq %d row %d: payload %q, want %q", w, seq, i, payload, want)
			}
			counts[seq]++
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			v.problem("worker %d: reading rows: %v", w, err)
			return finish(len(workers), checkedRows)
		}

		for seq := we.FirstSeq; seq <= we.LastCommitted; seq++ {
			if counts[seq] != e.Batch {
				v.problem("worker %d seq %d: %d rows, want %d (the client saw COMMIT succeed)", w, seq, counts[seq], e.Batch)
			}
		}
		inDoubtApplied := false
		if we.InDoubtSeq > 0 {
			switch counts[we.InDoubtSeq] {
			case 0:
			case e.Batch:
				inDoubtApplied = true
			default:
				v.problem("worker %d in-doubt seq %d: %d rows, want 0 or %d (partial transaction)",
					w, we.InDoubtSeq, counts[we.InDoubtSeq], e.Batch)
			}
		}
		var extra []int
		for seq := range counts {
			if seq > we.LastCommitted && seq != we.InDoubtSeq {
				extra = append(extra, seq)
			}
		}
		sort.Ints(extra)
		for _, seq := range extra {
			v.problem("worker %d seq %d: %d rows present, but the client never saw it commit", w, seq, counts[seq])
		}

		var n int64
		if err := db.QueryRowContext(ctx, "SELECT n FROM "+e.CountersTable+" WHERE worker = ?", w).Scan(&n); err != nil {
			v.problem("worker %d: reading counter: %v", w, err)
			continue
		}
		want := we.CounterExpected
		if inDoubtApplied {
			if e.SQL == "insert" {
				want += int64(e.Batch)
			} else {
				want = int64(we.InDoubtSeq)
			}
		}
		if n != want {
			v.problem("worker %d: counter %d, want %d (%s mode; a larger value means a transaction applied twice)",
				w, n, want, e.SQL)
		}
	}
	return finish(len(workers), checkedRows)
}
