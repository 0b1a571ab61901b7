package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
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
	if req.SHA256 != "" && !strings.EqualFold(res.SHA256, req.SHA256) {
		// An agentd that does not know pins ignores them: checked here.
		return nil, g.fetchMismatch(ctx, org, a, m, t, req, res)
	}
	return res, nil
}

// fetchMismatch records that the environment stored a download other than
// the one file.fetch pinned (file.fetch_mismatch, with both hashes), so
// the log does not go on saying the pinned bytes were placed, and answers
// 502 fetch_mismatch. The answer is the same when the record cannot be
// written; the failure is logged.
func (g *Gateway) fetchMismatch(ctx context.Context, org Org, a *authz.Actor, m Meta, t sessions.Target, req agentd.FetchRequest, res *agentd.FetchResponse) error {
	details := map[string]any{"url": req.URL, "path": req.Path, "pinned_sha256": req.SHA256, "stored_sha256": res.SHA256, "stored_size": res.Size}
	if _, err := org.Audit.Append(context.WithoutCancel(ctx), event(a, m, "file.fetch_mismatch", sessions.AuditTarget(t.Session), details)); err != nil {
		g.logger().Error("file fetch mismatch not recorded", "org", org.Slug, "session", t.Session.ID, "error", err)
	}
	stored := res.SHA256
	if stored == "" {
		stored = "(not reported: agentd does not check pins)"
	}
	return apperr.New(apperr.ErrUpstream, "fetch_mismatch",
		"The environment stored a download with SHA-256 %s at %s; the request pinned %s. Its file is not the pinned one.", stored, req.Path, req.SHA256)
}
