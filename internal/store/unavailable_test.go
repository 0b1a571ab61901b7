package store_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gatehouse/gatehouse/internal/netfault"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestClassifyErrors pins the classifier's table on error values: SQLSTATE
// decides, the message never does.
func TestClassifyErrors(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	for _, tc := range []struct {
		name string
		err  error
		want store.Outage
	}{
		{"nil", nil, store.NotOutage},
		{"connection failure 08006", pg("08006"), store.Refused},
		{"unable to establish 08001", pg("08001"), store.Refused},
		{"connection does not exist 08003", pg("08003"), store.Refused},
		{"too many connections 53300", pg("53300"), store.Refused},
		{"admin shutdown 57P01", pg("57P01"), store.Refused},
		{"crash shutdown 57P02", pg("57P02"), store.Refused},
		{"cannot connect now 57P03", pg("57P03"), store.Refused},
		{"wrapped admin shutdown", fmt.Errorf("list sessions: %w", pg("57P01")), store.Refused},
		{"55000 from a statement", pg("55000"), store.NotOutage},
		{"unique violation", pg("23505"), store.NotOutage},
		{"undefined table", pg("42P01"), store.NotOutage},
		{"disk full 53100", pg("53100"), store.NotOutage},
		{"query canceled 57014", pg("57014"), store.NotOutage},
		{"bare dial refused (agentd's as much as a database's)", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, store.MaybeOutage},
		{"bare ECONNREFUSED", fmt.Errorf("x: %w", syscall.ECONNREFUSED), store.MaybeOutage},
		{"read reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, store.MaybeOutage},
		{"EOF", io.EOF, store.MaybeOutage},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), store.MaybeOutage},
		{"bad connection", driver.ErrBadConn, store.MaybeOutage},
		{"pgx conn closed", pgconn.ErrConnClosed, store.MaybeOutage},
		{"reset", syscall.ECONNRESET, store.MaybeOutage},
		{"text that merely looks like an outage", errors.New("failed to connect to `db`: connection refused"), store.NotOutage},
		{"context canceled", context.Canceled, store.NotOutage},
	} {
		if got := store.Classify(tc.err); got != tc.want {
			t.Errorf("%s: Classify(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
		if got, want := store.IsUnavailable(tc.err), tc.want != store.NotOutage; got != want {
			t.Errorf("%s: IsUnavailable = %v, want %v", tc.name, got, want)
		}
	}
}

// TestClassifyConnectErrors classifies the driver's real connect errors:
// a server answering each refusal with its ErrorResponse (a proxy speaking
// the protocol, for states a shared server cannot be put in), a port
// nobody listens on, and a refusal about credentials or a missing
// database, which is configuration, not an outage.
func TestClassifyConnectErrors(t *testing.T) {
	t.Parallel()
	admin := storetest.AdminDSN(t)
	for _, tc := range []struct {
		code string
		want store.Outage
	}{
		{"57P03", store.Refused},
		{"53300", store.Refused},
		{"08006", store.Refused},
		{"08004", store.Refused},
		{"57P01", store.Refused},
		{"55000", store.Refused},
		{"28P01", store.NotOutage},
		{"3D000", store.NotOutage},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			fwd, dsn, err := netfault.Reroute(admin)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fwd.Close() })
			fwd.Refuse(netfault.PGError{Code: tc.code, Message: "refused by the test"})
			err = connect(t, dsn)
			var ce *pgconn.ConnectError
			if !errors.As(err, &ce) {
				t.Fatalf("connect: %v, want a ConnectError", err)
			}
			if got := store.Classify(err); got != tc.want {
				t.Fatalf("Classify(%v) = %v, want %v", err, got, tc.want)
			}
		})
	}
	t.Run("nobody listening", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		err = connect(t, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
		if got := store.Classify(err); got != store.Refused {
			t.Fatalf("Classify(%v) = %v, want Refused", err, got)
		}
	})
}

// TestClassifyRefusingDatabase puts a real database in the refusing state
// (ALLOW_CONNECTIONS false, its backends terminated): the query on a
// connection that was open fails with 57P01 or a closed connection, and a
// new connection fails with 55000; through a pool (store.Open) every
// failure is an outage.
func TestClassifyRefusingDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := storetest.NewName("gh_test_refuse_")
	storetest.CreatePostgresDB(t, name)
	dsn, err := store.WithDatabase(storetest.AdminDSN(t), name)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	db, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	if err := db.Exec("SELECT 1").Error; err != nil {
		t.Fatal(err)
	}

	allow := storetest.RefuseConnections(t, name)
	_, err = conn.Exec(ctx, "SELECT 1").ReadAll()
	if got := store.Classify(err); got == store.NotOutage {
		t.Errorf("query on a terminated connection: Classify(%v) = NotOutage", err)
	}
	err = connect(t, dsn)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Fatalf("connect to the refusing database: %v, want SQLSTATE 55000", err)
	}
	if got := store.Classify(err); got != store.Refused {
		t.Errorf("connect: Classify(%v) = %v, want Refused", err, got)
	}
	// Through the pool: its connection was ended, a new one is refused.
	for i := range 3 {
		err := db.Exec("SELECT 1").Error
		if err == nil || store.Classify(err) == store.NotOutage {
			t.Errorf("pool query %d on the refusing database: %v, want an outage", i, err)
		}
	}
	allow()
	if err := db.Exec("SELECT 1").Error; err != nil {
		t.Fatalf("pool query once connections are allowed again: %v", err)
	}
}

// TestClassifySQLiteFileGone is the embedded engine's outage: a database
// file that cannot be opened.
func TestClassifySQLiteFileGone(t *testing.T) {
	t.Parallel()
	_, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "missing", "dir", "x.db"), store.Options{})
	if got := store.Classify(err); got != store.Refused {
		t.Fatalf("Classify(%v) = %v, want Refused", err, got)
	}
}

// connect makes one connection to dsn and returns why it failed.
func connect(t *testing.T, dsn string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	if err == nil {
		c.Close(ctx)
		t.Fatalf("connect to %s succeeded", dsn)
	}
	return err
}
