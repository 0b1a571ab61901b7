package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

const (
	// MaxWriteBytes is the largest file the gateway writes: agentd's
	// default write limit.
	MaxWriteBytes = agentd.DefaultWriteMaxBytes
	// fileWriteTimeout bounds passing a spooled file on to agentd.
	fileWriteTimeout = 11 * time.Minute
	// DefaultWriteSlots is how many writes a replica spools at once unless
	// configured: 8 × 64 MiB = 512 MiB of temporary disk at most.
	DefaultWriteSlots = 8
	// DefaultWriteSlotWait is how long a write waits for a slot: long
	// enough to ride out a burst, short enough that a client is told to
	// come back rather than left hanging behind other uploads.
	DefaultWriteSlotWait = 2 * time.Second
	// writeBusyRetry is the Retry-After of a write refused as busy.
	writeBusyRetry = 5 * time.Second
	// writeIdleTimeout ends a write whose body stops arriving: a slot held
	// by an upload that sends a byte a minute would otherwise be held for
	// as long as the sender likes.
	writeIdleTimeout = 30 * time.Second
)

// WriteRequest is a file to write into a session's environment.
type WriteRequest struct {
	Path string
	Mode os.FileMode // 0: agentd's default, 0644
	Body io.Reader
	// ReadDeadline, when set, sets the read deadline of the connection
	// Body arrives on (http.ResponseController's SetReadDeadline): the
	// spool moves it writeIdleTimeout ahead before every read, so a body
	// that stalls ends the write and frees its slot.
	ReadDeadline func(time.Time) error
}

// WriteFile writes a file into the session's environment. The audit
// record (path, size, SHA-256, never the contents) must be durable before
// agentd hears of the write, and it must carry the hash, so the body is
// first spooled to a temporary file (at most MaxWriteBytes) while being
// hashed, then audited, then passed on from that file. Authorization comes
// before the spooling: a refused caller's body is not read. The spool
// holds one of the replica's write slots until the file is gone; a write
// that gets none in time is refused as busy, unread and unaudited.
func (g *Gateway) WriteFile(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, req WriteRequest) (*agentd.WriteResponse, error) {
	v := apperr.Validation()
	if req.Path == "" {
		v.Add("path", "Give the path of the file to write.")
	}
	if req.Mode&^0o777 != 0 {
		v.Add("mode", "mode must be octal permission bits from 0000 to 0777, such as 0644.")
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	t, err := resolve(ctx, org, a, sessionID, ActFilesWrite, nil)
	if err != nil {
		return nil, err
	}
	release, err := g.writeSlot(ctx, org.Slug)
	if err != nil {
		return nil, err
	}
	// Deferred first, so it runs last: the slot is free once the spool
	// file is removed, not before.
	defer release()
	body := req.Body
	if req.ReadDeadline != nil {
		body = &idleReader{r: body, set: req.ReadDeadline}
		defer func() { _ = req.ReadDeadline(time.Time{}) }()
	}
	spool, size, sum, err := spoolBody(body)
	if err != nil {
		return nil, err
	}
	defer func() {
		spool.Close()
		os.Remove(spool.Name())
	}()
	full := inWorkspace(t, req.Path)
	details := map[string]any{"path": full, "size": size, "sha256": sum}
	if req.Mode != 0 {
		details["mode"] = fmt.Sprintf("%04o", req.Mode)
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "file.write", sessions.AuditTarget(t.Session), details)); err != nil {
		return nil, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, fileWriteTimeout)
	defer cancel()
	res, err := g.client(t).WriteFile(fctx, full, req.Mode, spool, size)
	if err != nil {
		return nil, g.upstream(ctx, org, t, err)
	}
	if res.SHA256 != sum || res.Size != size {
		return nil, g.writeMismatch(ctx, org, a, m, t, full, size, sum, res)
	}
	return res, nil
}

// writeMismatch records that the environment stored something other than
// what file.write audited (file.write_mismatch, with both sizes and
// hashes), so the log does not go on saying the audited bytes were
// written, and answers 502 write_mismatch. The answer is the same when the
// record cannot be written; the failure is logged.
func (g *Gateway) writeMismatch(ctx context.Context, org Org, a *authz.Actor, m Meta, t sessions.Target, full string, size int64, sum string, res *agentd.WriteResponse) error {
	details := map[string]any{"path": full, "sent_size": size, "sent_sha256": sum, "stored_size": res.Size, "stored_sha256": res.SHA256}
	e := event(a, m, "file.write_mismatch", sessions.AuditTarget(t.Session), details)
	if _, err := org.Audit.Append(context.WithoutCancel(ctx), e); err != nil {
		g.logger().Error("file write mismatch not recorded", "org", org.Slug, "session", t.Session.ID, "error", err)
	}
	return apperr.New(apperr.ErrUpstream, "write_mismatch",
		"The environment stored %d bytes with SHA-256 %s; %d bytes with SHA-256 %s were sent.", res.Size, res.SHA256, size, sum)
}

// writeSlot takes one of the replica's WriteSlots for a write, from its
// spool until it is passed on (each slot stands for MaxWriteBytes of
// temporary disk), waiting at most WriteSlotWait and no longer than ctx.
// One org holds at most half the slots, so another org's uploads always
// find room however many one org keeps busy. release gives the slot back.
func (g *Gateway) writeSlot(ctx context.Context, org string) (release func(), err error) {
	slots := g.WriteSlots
	if slots <= 0 {
		slots = DefaultWriteSlots
	}
	perOrg := max(1, slots/2)
	g.spoolingOnce.Do(func() {
		g.spooling = semaphore.NewWeighted(int64(slots))
		g.spoolingOrgs = map[string]int{}
	})
	busy := func(msg string, args ...any) error {
		e := apperr.New(apperr.ErrUnavailable, "replica_busy", msg, args...)
		e.RetryAfter = writeBusyRetry
		return e
	}
	g.spoolingMu.Lock()
	if g.spoolingOrgs[org] >= perOrg {
		g.spoolingMu.Unlock()
		return nil, busy("This console server is already writing %d files of this organization, as many as one organization may at once; try again in a few seconds.", perOrg)
	}
	g.spoolingOrgs[org]++
	g.spoolingMu.Unlock()
	leave := func() {
		g.spoolingMu.Lock()
		if g.spoolingOrgs[org]--; g.spoolingOrgs[org] <= 0 {
			delete(g.spoolingOrgs, org)
		}
		g.spoolingMu.Unlock()
	}
	wait := g.WriteSlotWait
	if wait <= 0 {
		wait = DefaultWriteSlotWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := g.spooling.Acquire(wctx, 1); err != nil {
		leave()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("gateway: wait for a write slot: %w", ctx.Err())
		}
		return nil, busy("This console server is busy with other file uploads (it takes %d at a time); try again in a few seconds.", slots)
	}
	return func() { g.spooling.Release(1); leave() }, nil
}

// idleReader moves its connection's read deadline writeIdleTimeout ahead
// before every read, so a body that stops arriving fails the read.
type idleReader struct {
	r   io.Reader
	set func(time.Time) error
}

func (i *idleReader) Read(p []byte) (int, error) {
	_ = i.set(time.Now().Add(writeIdleTimeout)) // a writer without deadlines just never times out
	return i.r.Read(p)
}

// spoolBody copies body to a temporary file, hashing it, and rewinds the
// file. A body over MaxWriteBytes is refused and nothing is kept.
func spoolBody(body io.Reader) (*os.File, int64, string, error) {
	f, err := os.CreateTemp("", "gatehouse-write-*")
	if err != nil {
		return nil, 0, "", fmt.Errorf("gateway: spool write: %w", err)
	}
	fail := func(err error) (*os.File, int64, string, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, "", err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, MaxWriteBytes+1))
	switch {
	case n > MaxWriteBytes:
		return fail(apperr.New(apperr.ErrInvalid, "body_too_large", "The file is larger than the %d MiB write limit.", MaxWriteBytes>>20))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fail(apperr.New(apperr.ErrInvalid, "body_stalled", "No more of the request body arrived for %s after %d bytes; nothing was written.", writeIdleTimeout, n))
	case err != nil:
		return fail(apperr.New(apperr.ErrInvalid, "body_incomplete", "The request body ended after %d bytes, before it was complete; nothing was written.", n))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fail(fmt.Errorf("gateway: rewind spool: %w", err))
	}
	return f, n, hex.EncodeToString(h.Sum(nil)), nil
}
