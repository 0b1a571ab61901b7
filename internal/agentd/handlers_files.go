package agentd

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
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
	if req.Unpack != "" {
		if err := checkFormat(req.Unpack); err != nil {
			return err
		}
	}
	pin := strings.ToLower(req.SHA256)
	if pin != "" {
		if b, err := hex.DecodeString(pin); err != nil || len(b) != sha256.Size {
			return newError(CodeBadRequest, "The sha256 must be 64 hexadecimal digits.")
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	resp, err := s.files.fetch(ctx, s.cfg.FetchClient, fetchSpec{
		url: req.URL, path: req.Path, maxBytes: maxBytes,
		unpack: req.Unpack, sha256: pin, lim: s.limits(),
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// limits are the write limits of the configuration.
func (s *Server) limits() writeLimits {
	return writeLimits{maxBytes: s.cfg.WriteMaxBytes, unpackBytes: s.cfg.UnpackMaxBytes, unpackFiles: s.cfg.UnpackMaxFiles}
}

// handleWriteFile answers PUT /v1/files by storing the body at path.
func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	mode, err := parseMode(q.Get("mode"))
	if err != nil {
		return err
	}
	if r.ContentLength > s.cfg.WriteMaxBytes {
		return newError(CodeTooLarge, "The body is %d bytes, over the write limit of %d.", r.ContentLength, s.cfg.WriteMaxBytes)
	}
	resp, err := s.files.writeFile(q.Get("path"), mode, r.Body, s.cfg.WriteMaxBytes)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// handleWriteArchive answers PUT /v1/files/archive by unpacking the body
// into the directory path.
func (s *Server) handleWriteArchive(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkFormat(q.Get("format")); err != nil {
		return err
	}
	if r.ContentLength > s.cfg.WriteMaxBytes {
		return newError(CodeTooLarge, "The archive is %d bytes, over the write limit of %d.", r.ContentLength, s.cfg.WriteMaxBytes)
	}
	resp, err := s.files.writeArchive(q.Get("path"), q.Get("format"), r.Body, s.limits())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// handleCopy answers POST /v1/files/copy.
func (s *Server) handleCopy(w http.ResponseWriter, r *http.Request) error {
	var req CopyRequest
	if err := decodeJSON(w, r, &req, maxJSONBody); err != nil {
		return err
	}
	resp, err := s.files.copyIn(req.From, req.To, s.limits())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// handleRekey answers POST /v1/token: the token that authenticated the
// request is replaced by the new one, once. The console rekeys a sandbox
// made from a template right after creating it, so the template's token,
// shared by every sandbox of the template, stops opening this one. A
// second rekey is refused: whoever holds the new token cannot be locked
// out by someone holding the template's (who could no longer authenticate
// anyway) or trade it again. So is a rekey after any other request the
// template's token authenticated: someone else with that token may have
// started a command or planted a file the rekey would not undo.
func (s *Server) handleRekey(w http.ResponseWriter, r *http.Request) error {
	var req RekeyRequest
	if err := decodeJSON(w, r, &req, maxJSONBody); err != nil {
		return err
	}
	if n := len(req.Token); n < MinRekeyTokenLength {
		return newError(CodeBadRequest, "The new token has %d characters; it must have at least %d.", n, MinRekeyTokenLength)
	}
	sum := sha256.Sum256([]byte(req.Token))
	s.tokenMu.Lock()
	defer s.tokenMu.Unlock()
	if s.rekeyed {
		return newError(CodeAlreadyRekeyed, "This agentd was already given its own token; it accepts one rekey only.")
	}
	if s.usedBefore.Load() {
		// Whoever else holds the template's token got in first: a command
		// started then, or a file written, would outlive the rekey.
		return newError(CodeUsedBeforeRekey, "This agentd already served a request with the template's token; a rekey must come first, so this sandbox should not be used.")
	}
	if subtle.ConstantTimeCompare(sum[:], s.tokenHash[:]) == 1 {
		return newError(CodeBadRequest, "The new token must differ from the current one.")
	}
	s.tokenHash = sum
	s.rekeyed = true
	w.WriteHeader(http.StatusNoContent)
	return nil
}
