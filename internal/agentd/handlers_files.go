package agentd

import (
	"context"
	"io"
	"net/http"
	"strconv"
)

// handleReadFile answers GET /v1/files with the raw bytes of a file range.
func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	offset, err := queryUint(q.Get("offset"), "offset")
	if err != nil {
		return err
	}
	limit := uint64(maxFileReadLimit)
	if v := q.Get("limit"); v != "" {
		if limit, err = queryUint(v, "limit"); err != nil {
			return err
		}
		if limit > maxFileReadLimit {
			return newError(CodeBadRequest, "The limit must be at most %d.", maxFileReadLimit)
		}
	}
	if offset > 1<<62 {
		return newError(CodeBadRequest, "The offset is too large.")
	}
	body, size, n, err := s.files.readFile(q.Get("path"), int64(offset), int64(limit))
	if err != nil {
		return err
	}
	defer body.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set(FileHeaderSize, strconv.FormatInt(size, 10))
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, body)
	return nil
}

// handleStat answers POST /v1/files/stat for a batch of paths.
func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) error {
	var req StatRequest
	if err := decodeJSON(w, r, &req, maxJSONBody); err != nil {
		return err
	}
	if len(req.Paths) > maxStatPaths {
		return newError(CodeBadRequest, "At most %d paths may be examined at once.", maxStatPaths)
	}
	writeJSON(w, http.StatusOK, StatResponse{Results: s.files.statAll(req.Paths)})
	return nil
}

// handleFetch answers POST /v1/files/fetch by downloading a URL into a file.
func (s *Server) handleFetch(w http.ResponseWriter, r *http.Request) error {
	var req FetchRequest
	if err := decodeJSON(w, r, &req, maxJSONBody); err != nil {
		return err
	}
	switch {
	case req.URL == "":
		return newError(CodeBadRequest, "The url is required.")
	case req.Path == "":
		return newError(CodeBadRequest, "The path is required.")
	case req.MaxBytes < 0 || req.MaxBytes > s.cfg.FetchMaxBytes:
		return newError(CodeBadRequest, "The max_bytes must be between 0 and %d.", s.cfg.FetchMaxBytes)
	case req.TimeoutMS < 0:
		return newError(CodeBadRequest, "The timeout_ms must not be negative.")
	}
	maxBytes := req.MaxBytes
	if maxBytes == 0 {
		maxBytes = s.cfg.FetchMaxBytes
	}
	timeout := s.cfg.FetchTimeout
	if req.TimeoutMS > 0 && req.TimeoutMS < timeout.Milliseconds() {
		timeout = fetchDeadline(req.TimeoutMS, timeout)
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	n, err := s.files.fetch(ctx, s.cfg.FetchClient, req.URL, req.Path, maxBytes)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, FetchResponse{Path: req.Path, Size: n})
	return nil
}
