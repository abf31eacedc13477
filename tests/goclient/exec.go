package main

// -mode exec: run each -exec statement in order on one pinned connection and report what
// the driver made of the answer: the rows (first column, as strings) or the error the driver
// parsed (number, SQLSTATE, message) — how DM would see a proxy's own error.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
)

type stringsFlag []string

func (s *stringsFlag) String() string     { return fmt.Sprint(*s) }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

type execResult struct {
	SQL      string   `json:"sql"`
	Rows     []string `json:"rows,omitempty"`
	Number   uint16   `json:"error_number,omitempty"`
	SQLState string   `json:"sqlstate,omitempty"`
	Message  string   `json:"message,omitempty"`
	Error    string   `json:"error,omitempty"` // not a server error (connection, driver)
}

func runExec(o *options) bool {
	db := o.openDB(1)
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		emit(o, map[string]interface{}{"ok": false, "error": err.Error()})
		return false
	}
	defer conn.Close()
	results := []execResult{}
	for _, statement := range o.exec {
		results = append(results, execOne(ctx, conn, statement))
	}
	emit(o, map[string]interface{}{"ok": true, "results": results})
	return true
}

func execOne(ctx context.Context, conn *sql.Conn, statement string) execResult {
	r := execResult{SQL: statement}
	rows, err := conn.QueryContext(ctx, statement)
	if err == nil {
		for rows.Next() {
			var v []byte
			if err = rows.Scan(&v); err != nil {
				break
			}
			r.Rows = append(r.Rows, string(v))
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		r.Number, r.SQLState, r.Message = myErr.Number, string(myErr.SQLState[:]), myErr.Message
	} else if err != nil {
		r.Error = err.Error()
	}
	return r
}
