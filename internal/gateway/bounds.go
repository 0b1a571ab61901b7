package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
)

// Limits of what a client may ask of the gateway. Each is what agentd
// accepts (or the most it would use), checked before anything is recorded,
// audited or forwarded: a request agentd would refuse is refused here, and
// no duration overflows when converted (an overflowing timeout would wrap
// into an immediate deadline, counted as an agentd failure).
const (
	// maxExecTimeout is agentd's largest timeout_ms of a command.
	maxExecTimeout = agentd.MaxTimeout
	// maxExecWait is agentd's longest wait_ms, which it clamps to.
	maxExecWait = agentd.MaxWait
	// maxFetchTimeout is agentd's fetch deadline: a longer timeout_ms
	// would be cut to it.
	maxFetchTimeout = agentd.DefaultFetchTimeout
	// maxFetchBytes is agentd's largest download.
	maxFetchBytes = agentd.DefaultFetchMaxBytes
	// maxReadLimit is agentd's largest file read.
	maxReadLimit = agentd.MaxFileRead
	// maxReadOffset is agentd's largest read offset.
	maxReadOffset = 1 << 62
	// fileReadTimeout bounds a whole file read, from the request to the
	// last byte passed on: 64 MiB to a client reading 100 KiB a second.
	fileReadTimeout = 11 * time.Minute
)

// Validate checks what an exec asks against what agentd accepts, naming
// each field and its range: it is called before the command is recorded,
// so a refused exec leaves no record and reaches no agentd.
func (r ExecRequest) Validate() error {
	v := apperr.Validation()
	if strings.TrimSpace(r.Command) == "" || len(r.Command) > maxCommandLen {
		v.Add("command", "Give the command to run, at most 64 KiB.")
	}
	if r.TimeoutMS < 0 || r.TimeoutMS > maxExecTimeout.Milliseconds() {
		v.Add("timeout_ms", "timeout_ms must be from 0 (no timeout) to %d (7 days).", maxExecTimeout.Milliseconds())
	}
	if r.WaitMS < 0 || r.WaitMS > maxExecWait.Milliseconds() {
		v.Add("wait_ms", "wait_ms must be from 0 to %d (60 seconds).", maxExecWait.Milliseconds())
	}
	if r.Rows > agentd.MaxTTYDimension || r.Cols > agentd.MaxTTYDimension {
		v.Add("rows", "rows and cols must be from 1 to %d (0: the default size).", agentd.MaxTTYDimension)
	}
	return v.Err()
}

// validateFetch checks a download's size and duration.
func validateFetch(req agentd.FetchRequest) error {
	v := apperr.Validation()
	if req.URL == "" {
		v.Add("url", "Give the URL to download.")
	}
	if req.Path == "" {
		v.Add("path", "Give the path to write the download to.")
	}
	if req.MaxBytes < 0 || req.MaxBytes > maxFetchBytes {
		v.Add("max_bytes", "max_bytes must be from 0 (the environment's limit) to %d (1 GiB).", int64(maxFetchBytes))
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > maxFetchTimeout.Milliseconds() {
		v.Add("timeout_ms", "timeout_ms must be from 0 (the environment's limit) to %d (10 minutes).", maxFetchTimeout.Milliseconds())
	}
	if req.Unpack != "" && req.Unpack != agentd.ArchiveTarGz && req.Unpack != agentd.ArchiveZip {
		v.Add("unpack", "unpack must be empty, %q or %q.", agentd.ArchiveTarGz, agentd.ArchiveZip)
	}
	if b, err := hex.DecodeString(req.SHA256); req.SHA256 != "" && (err != nil || len(b) != sha256.Size) {
		v.Add("sha256", "sha256 must be 64 hexadecimal digits.")
	}
	return v.Err()
}

// validateRead checks a file read's range.
func validateRead(p string, offset, limit int64) error {
	v := apperr.Validation()
	if p == "" {
		v.Add("path", "Give the path of the file to read.")
	}
	if offset < 0 || offset > maxReadOffset {
		v.Add("offset", "offset must be from 0 to %d.", int64(maxReadOffset))
	}
	if limit < 0 || limit > maxReadLimit {
		v.Add("limit", "limit must be from 0 (as much as allowed) to %d (64 MiB).", int64(maxReadLimit))
	}
	return v.Err()
}

// fetchDeadline is how long the gateway waits for a download: agentd's
// own deadline for it, plus the usual call timeout for the answer.
func (g *Gateway) fetchDeadline(timeoutMS int64) time.Duration {
	d := maxFetchTimeout
	if timeoutMS > 0 {
		d = time.Duration(timeoutMS) * time.Millisecond
	}
	return d + g.callTimeout()
}

// fileBody is a file read's body that ends the read's context when closed.
type fileBody struct {
	io.Reader
	body   io.Closer
	cancel context.CancelFunc
}

func (b *fileBody) Close() error {
	err := b.body.Close()
	b.cancel()
	return err
}
