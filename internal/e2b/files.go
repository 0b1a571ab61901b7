package e2b

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/gateway"
)

// readFile is envd's GET /files?path=: the file's bytes, read through the
// gateway (audited as file.read) and passed on as they arrive.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	err := s.streamFile(w, r, c)
	if ferr := c.Actor.Flush(r.Context()); ferr != nil && err == nil {
		err = gateway.Unrecorded(ferr)
	}
	if err != nil {
		s.fail(w, r, err)
	}
}

func (s *Server) streamFile(w http.ResponseWriter, r *http.Request, c call) error {
	p := r.URL.Query().Get("path")
	if p == "" {
		return &apperr.ValidationError{Fields: map[string]string{"path": "Give the path of the file to read."}}
	}
	f, err := s.Gateway.ReadFile(r.Context(), c.Org, c.Actor, c.meta, c.SessionID, p, 0, 0)
	if err != nil {
		return err
	}
	defer f.Body.Close()
	if f.Size > agentd.MaxFileRead {
		// Refused before a byte is sent: a body cut short at the limit
		// would read as the whole file.
		return apperr.New(apperr.ErrInvalid, "file_too_large",
			"%s is %d bytes, more than the %d this endpoint reads; read it in parts with a command (commands.run).", p, f.Size, int64(agentd.MaxFileRead))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if f.Length >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(f.Length, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := gateway.CopyFile(w, f.Body); err != nil {
		// The status is sent: the client sees a short body.
		s.logger().Warn("e2b data plane: file read ended early", "session_id", c.SessionID, "error", err)
	}
	return nil
}

// entryJSON is envd's REST EntryInfo.
type entryJSON struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// writeFile is envd's POST /files: each uploaded file (an octet-stream
// body, or the parts of a multipart form; optionally gzip-encoded) is
// written by the gateway's file write, authorized as a write to the
// session's files and audited as file.write with its path, size and
// SHA-256 (never its bytes) before it reaches the sandbox.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	c := callOf(r.Context())
	entries, err := s.writeFiles(r, c, http.NewResponseController(w).SetReadDeadline)
	if ferr := c.Actor.Flush(r.Context()); ferr != nil && err == nil {
		err = gateway.Unrecorded(ferr)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(entries)
}

func (s *Server) writeFiles(r *http.Request, c call, deadline func(time.Time) error) ([]entryJSON, error) {
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, &apperr.ValidationError{Fields: map[string]string{"body": "The body is not gzip-encoded as Content-Encoding says."}}
		}
		defer gz.Close()
		body = gz
	}
	p := r.URL.Query().Get("path")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		if p == "" {
			return nil, &apperr.ValidationError{Fields: map[string]string{"path": "Give the path of the file to write."}}
		}
		if err := s.writeOne(r.Context(), c, p, body, deadline); err != nil {
			return nil, err
		}
		return []entryJSON{entry(p)}, nil
	}
	mr := multipart.NewReader(body, params["boundary"])
	var out []entryJSON
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, &apperr.ValidationError{Fields: map[string]string{"body": "The multipart form could not be read: " + err.Error()}}
		}
		if part.FormName() != "file" {
			continue
		}
		if len(out) > 0 {
			if err := c.recheck(r.Context()); err != nil {
				return nil, err
			}
		}
		// One file: the query's path; several: each part's file name.
		target := p
		if target == "" || len(out) > 0 {
			target = partPath(part)
		}
		if target == "" {
			return nil, &apperr.ValidationError{Fields: map[string]string{"path": "Give the path of each file to write."}}
		}
		if err := s.writeOne(r.Context(), c, target, part, deadline); err != nil {
			return nil, err
		}
		out = append(out, entry(target))
	}
	if len(out) == 0 {
		return nil, &apperr.ValidationError{Fields: map[string]string{"file": "The form holds no file (a part named \"file\")."}}
	}
	return out, nil
}

// partPath is the path a form part names in its Content-Disposition
// file name, as the SDK sends it (files.write([...]) puts each file's
// whole path there). Not part.FileName(): that keeps only the last
// element, and every file would land in the workspace's top directory.
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

func entry(p string) entryJSON { return entryJSON{Path: p, Name: path.Base(p), Type: "file"} }

// writeOne writes one file through the gateway's audited write: the
// file.write record (path, size, SHA-256) is durable before agentd hears
// of it, and at most gateway.MaxWriteBytes of content (after gzip decoding)
// is read, so a small compressed body cannot inflate without bound. A
// body that stops arriving ends the write (deadline, the connection's).
func (s *Server) writeOne(ctx context.Context, c call, p string, content io.Reader, deadline func(time.Time) error) error {
	_, err := s.Gateway.WriteFile(ctx, c.Org, c.Actor, c.meta, c.SessionID, gateway.WriteRequest{Path: p, Body: content, ReadDeadline: deadline})
	return err
}
