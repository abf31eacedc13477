module replay-proxy/tests/goclient

go 1.26

// The driver TiDB DM v8.5 ships (pingcap/tiflow go.mod on release-8.5).
require github.com/go-sql-driver/mysql v1.7.1
