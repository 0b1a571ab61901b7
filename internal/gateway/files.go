package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// ReadFile reads part of a file in the session's environment, audited.
//
// The bytes are not held: the caller passes the returned Body on as it
// arrives and closes it (closing ends the read's deadline). Body yields at
// most limit bytes (0: agentd's maximum) and fails rather than yield more.
// The read is audited before agentd hears of it.
func (g *Gateway) ReadFile(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, p string, offset, limit int64) (*agentd.FileRange, error) {
	if err := validateRead(p, offset, limit); err != nil {
		return nil, err
	}
	t, err := resolve(ctx, org, a, sessionID, ActFilesRead, nil)
	if err != nil {
		return nil, err
	}
	full := inWorkspace(t, p)
	if _, err := org.Audit.Append(ctx, event(a, m, "file.read", sessions.AuditTarget(t.Session),
		map[string]any{"path": full, "offset": offset, "limit": limit})); err != nil {
		return nil, durable(err)
	}
	// The usual call timeout bounds agentd's answer to begin; the bytes
	// then flow at the client's pace, within fileReadTimeout.
	fctx, cancel := context.WithTimeout(ctx, fileReadTimeout)
	begun := time.AfterFunc(g.callTimeout(), cancel)
	f, err := g.client(t).OpenFile(fctx, full, offset, limit)
	begun.Stop()
	if err != nil {
		cancel()
		return nil, g.upstream(ctx, org, t, err)
	}
	f.Body = &fileBody{Reader: f.Body, body: f.Body, cancel: cancel}
	return f, nil
}

// CopyFile passes a file ReadFile opened on to w as agentd sends it, each
// read flushed to the client at once: net/http would hold the tail of a
// write (up to its 4 KiB buffer) until the next one, so a file whose
// writer waits on its reader (a pipe, a growing log) would stall.
func CopyFile(w http.ResponseWriter, body io.Reader) (int64, error) {
	return io.Copy(flushEach{w: w, rc: http.NewResponseController(w)}, body)
}

type flushEach struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushEach) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		if ferr := f.rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
			err = ferr
		}
	}
	return n, err
}

// Stat describes paths in the session's environment, audited.
func (g *Gateway) Stat(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, paths []string) ([]agentd.FileStat, error) {
	t, err := resolve(ctx, org, a, sessionID, ActFilesRead, nil)
	if err != nil {
		return nil, err
	}
	full := make([]string, len(paths))
	for i, p := range paths {
		full[i] = inWorkspace(t, p)
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "file.stat", sessions.AuditTarget(t.Session), map[string]any{"paths": full})); err != nil {
		return nil, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	res, err := g.client(t).Stat(fctx, full...)
	if err != nil {
		return nil, g.upstream(ctx, org, t, err)
	}
	return res, nil
}

// Fetch downloads a URL into a file of the session's environment, audited.
// Its size and duration are checked first: a refused fetch is neither
// audited nor forwarded.
func (g *Gateway) Fetch(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, req agentd.FetchRequest) (*agentd.FetchResponse, error) {
	if err := validateFetch(req); err != nil {
		return nil, err
	}
	t, err := resolve(ctx, org, a, sessionID, ActFilesFetch, nil)
	if err != nil {
		return nil, err
	}
	req.Path = inWorkspace(t, req.Path)
	details := map[string]any{"url": req.URL, "path": req.Path, "max_bytes": req.MaxBytes, "timeout_ms": req.TimeoutMS}
	if req.Unpack != "" {
		details["unpack"] = req.Unpack
	}
	if req.SHA256 != "" {
		details["sha256"] = req.SHA256
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "file.fetch", sessions.AuditTarget(t.Session), details)); err != nil {
		return nil, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.fetchDeadline(req.TimeoutMS))
	defer cancel()
	res, err := g.client(t).Fetch(fctx, req)
	if err != nil {
		return nil, g.upstream(ctx, org, t, err)
	}
	return res, nil
}
