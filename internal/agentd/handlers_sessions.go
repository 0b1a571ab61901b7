package agentd

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// handleCreateSession starts a command and, with wait_ms, waits for it.
func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) error {
	var req CreateSessionRequest
	if err := decodeJSON(w, r, &req, maxJSONBody); err != nil {
		return err
	}
	req.ExecRecords = r.Header.Get(HeaderExecRecords) == "1"
	spec, err := s.sessionSpec(req)
	if err != nil {
		return err
	}
	if spec.egress, err = s.egress.forSession(req.NetworkPolicy); err != nil {
		return err
	}
	spec.env = append(spec.env, spec.egress.environ()...)
	sess, err := s.startSession(spec, req)
	if err != nil {
		spec.egress.close()
		return err
	}
	if req.WaitMS > 0 {
		// Clamp before converting: a huge wait_ms would overflow.
		wait := time.NewTimer(time.Duration(min(req.WaitMS, maxWait.Milliseconds())) * time.Millisecond)
		select {
		case <-sess.done:
		case <-wait.C:
		case <-r.Context().Done():
		case <-s.closing:
		}
		wait.Stop()
	}
	resp, err := sess.snapshot(0, release{})
	if err != nil {
		return err
	}
	if req.ExecRecords {
		w.Header().Set(HeaderExecRecords, ExecRecordsUnavailable)
		if sess.exec != nil {
			w.Header().Set(HeaderExecRecords, ExecRecordsOn)
		}
	}
	writeJSON(w, http.StatusCreated, resp)
	return nil
}

// sessionSpec validates a create request and turns it into a procSpec.
func (s *Server) sessionSpec(req CreateSessionRequest) (procSpec, error) {
	switch {
	case strings.TrimSpace(req.Command) == "":
		return procSpec{}, newError(CodeBadRequest, "The command is required.")
	case len(req.Command) > maxCommandLen:
		return procSpec{}, newError(CodeBadRequest, "The command exceeds %d bytes.", maxCommandLen)
	case strings.IndexByte(req.Command, 0) >= 0:
		return procSpec{}, newError(CodeBadRequest, "The command contains a NUL byte.")
	case len(req.Env) > maxEnvVars:
		return procSpec{}, newError(CodeBadRequest, "At most %d environment variables are allowed.", maxEnvVars)
	case req.TimeoutMS < 0 || req.TimeoutMS > maxTimeout.Milliseconds():
		return procSpec{}, newError(CodeBadRequest, "The timeout_ms must be between 0 and %d.", maxTimeout.Milliseconds())
	case req.WaitMS < 0:
		return procSpec{}, newError(CodeBadRequest, "The wait_ms must not be negative.")
	case req.Rows > maxTTYDimension || req.Cols > maxTTYDimension:
		return procSpec{}, newError(CodeBadRequest, "The rows and cols must be at most %d.", maxTTYDimension)
	case req.Overflow != "" && req.Overflow != OverflowDrop && req.Overflow != OverflowBlock:
		return procSpec{}, newError(CodeBadRequest, "The overflow must be %q or %q.", OverflowDrop, OverflowBlock)
	case req.ID != "" && !validSessionID(req.ID):
		return procSpec{}, newError(CodeBadRequest, "The id must be 1 to 64 letters, digits, '_' or '-'.")
	case req.TTY && !ttySupported:
		return procSpec{}, newError(CodeTTYUnsupported, "This platform cannot run tty sessions.")
	}
	env := slices.Clip(s.baseEnv)
	if req.TTY {
		env = append(env, "TERM=xterm-256color")
	}
	keys := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return procSpec{}, newError(CodeBadRequest, "The environment variable %q is not valid.", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+req.Env[k]) // later entries win
	}
	dir, err := s.resolveCwd(req.Cwd)
	if err != nil {
		return procSpec{}, err
	}
	spec := procSpec{
		runAs:   s.cfg.RunAs,
		shell:   s.cfg.Shell,
		command: req.Command,
		dir:     dir,
		env:     env,
		tty:     req.TTY,
		rows:    req.Rows,
		cols:    req.Cols,
		stdin:   req.Stdin,
	}
	if spec.tty {
		if spec.rows == 0 {
			spec.rows = defaultRows
		}
		if spec.cols == 0 {
			spec.cols = defaultCols
		}
	}
	return spec, nil
}

// startSession reserves a slot under the session cap and starts the command.
func (s *Server) startSession(spec procSpec, req CreateSessionRequest) (*session, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, newError(CodeShuttingDown, "The server is shutting down.")
	}
	if s.running >= s.cfg.MaxSessions {
		s.mu.Unlock()
		return nil, newError(CodeTooManySessions, "At most %d sessions may run at once.", s.cfg.MaxSessions)
	}
	id := req.ID
	if id == "" {
		id = newSessionID()
	} else if _, taken := s.sessions[id]; taken || s.starting[id] {
		s.mu.Unlock()
		return nil, newError(CodeIDInUse, "A session with id %q exists.", id)
	} else if at, killed := s.killedFirst[id]; killed && time.Since(at) < killedFirstTTL {
		s.mu.Unlock()
		return nil, newError(CodeKilledFirst, "Session %q was killed before its create arrived; it does not start.", id)
	}
	if s.starting == nil {
		s.starting = map[string]bool{}
	}
	s.starting[id] = true
	s.running++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.starting, id)
		s.mu.Unlock()
	}()

	if s.execMon != nil {
		s.execMon.starting.Add(1)
		defer s.execMon.starting.Add(-1)
	}
	proc, err := startProcess(spec, s.tracker)
	if err != nil {
		s.mu.Lock()
		s.running--
		s.mu.Unlock()
		if errors.Is(err, errTTYUnsupported) {
			return nil, newError(CodeTTYUnsupported, "This platform cannot run tty sessions.")
		}
		if errors.Is(err, errRunAsUnsupported) {
			return nil, newError(CodeBadRequest, "This platform cannot run commands as another user.")
		}
		s.cfg.Logger.Error("start command", "error", err)
		return nil, newError(CodeBadRequest, "The command could not be started.")
	}
	timing := sessionTiming{killGrace: s.cfg.KillGrace, drainGrace: s.cfg.DrainGrace, pollBytes: s.cfg.PollBytes}
	sess := newSession(id, proc, spec, s.cfg.RingBytes, req.Overflow == OverflowBlock, timing, s.sessionEnded)
	spec.egress.attach(sess)
	if s.execMon != nil && proc.pid() > 0 {
		// Claimed before the session runs on: records of what the leader
		// did meanwhile were kept for it. A session that did not ask is
		// tracked only so that nothing is read for it.
		sess.execMon = s.execMon
		if req.ExecRecords {
			sess.exec = s.execMon.claim(proc.pid(), true, sess.appendExec)
		} else {
			sess.exec = s.execMon.claim(proc.pid(), false, nil)
		}
	}

	s.mu.Lock()
	at, killedFirst := s.killedFirst[id]
	closed := s.closed || killedFirst && time.Since(at) < killedFirstTTL
	s.sessions[sess.id] = sess
	if len(s.sessions)-s.running > s.cfg.MaxEndedSessions {
		s.reclaimOldestEnded()
	}
	s.mu.Unlock()
	sess.start(time.Duration(req.TimeoutMS) * time.Millisecond)
	if closed { // Close, or a kill of this id, ran while we were starting: it did not see us.
		sess.kill(StateKilled)
	}
	return sess, nil
}

func (s *Server) sessionEnded(sess *session) {
	sess.egress.close()
	s.mu.Lock()
	s.running--
	s.ended = append(s.ended, endedSession{sess: sess, at: time.Now()})
	s.mu.Unlock()
}

// killedFirstTTL is how long a kill of an unknown id keeps its create
// from starting: far longer than any create is on its way.
const killedFirstTTL = 15 * time.Minute

// maxKilledFirst bounds the ids remembered (a flood of kills of made-up
// ids must not grow memory): past it the oldest are dropped.
const maxKilledFirst = 10000

// killBeforeStart remembers that a kill named id before a session of that
// id existed (see Server.killedFirst).
func (s *Server) killBeforeStart(id string) {
	if id == "" {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.killedFirst == nil {
		s.killedFirst = map[string]time.Time{}
	}
	if len(s.killedFirst) >= maxKilledFirst {
		oldest, at := "", now
		for k, t := range s.killedFirst {
			if now.Sub(t) > killedFirstTTL {
				delete(s.killedFirst, k)
			} else if t.Before(at) {
				oldest, at = k, t
			}
		}
		if len(s.killedFirst) >= maxKilledFirst {
			delete(s.killedFirst, oldest)
		}
	}
	s.killedFirst[id] = now
}

func (s *Server) session(id string) (*session, error) {
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess == nil {
		return nil, newError(CodeNotFound, "There is no session %q.", id)
	}
	return sess, nil
}

// handlePollSession long-polls for output after a cursor.
func (s *Server) handlePollSession(w http.ResponseWriter, r *http.Request) error {
	sess, err := s.session(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	cursor, err := queryUint(q.Get("cursor"), "cursor")
	if err != nil {
		return err
	}
	waitMS, err := queryUint(q.Get("wait_ms"), "wait_ms")
	if err != nil {
		return err
	}
	wait := min(time.Duration(min(waitMS, uint64(maxWait.Milliseconds())))*time.Millisecond, maxWait)
	rel := acking(cursor)
	switch q.Get("ack") {
	case "", "1", "true":
	case "0", "false":
		rel = release{}
	default:
		return newError(CodeBadRequest, "The ack parameter must be true or false.")
	}
	if v := q.Get("ack_to"); v != "" {
		// A recorder reads ahead of what it has stored: it acknowledges
		// only that much, and the rest stays held for it.
		to, err := queryUint(v, "ack_to")
		if err != nil {
			return err
		}
		switch {
		case !rel.ack:
			return newError(CodeBadRequest, "ack_to acknowledges output; it cannot be combined with ack=false.")
		case to > cursor:
			return newError(CodeBadRequest, "The ack_to %d is past the cursor %d: only output already read can be acknowledged.", to, cursor)
		}
		rel.to = to
	}
	resp, err := sess.poll(cursor, wait, s.closing, r.Context().Done(), rel)
	if err != nil {
		return err
	}
	w.Header().Set(HeaderAckTo, "1")
	if WantsChunks(r) {
		writeBinary(w, resp)
		return nil
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func queryUint(v, name string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, newError(CodeBadRequest, "The %s must be a non-negative integer.", name)
	}
	return n, nil
}

// handleDeleteSession kills the session's process group and waits for it to
// end; for an ended session it only reports the final state.
func (s *Server) handleDeleteSession(w http.ResponseWriter, r *http.Request) error {
	sess, err := s.session(r.PathValue("id"))
	if err != nil {
		// Its create may be on its way, or starting: it must not run.
		// The answer stays "no such session".
		s.killBeforeStart(r.PathValue("id"))
		return err
	}
	sess.kill(StateKilled)
	if r.URL.Query().Get("grace") == "0" {
		// No grace: whoever asks again after a kill that did not end the
		// session wants it ended now.
		sess.proc.killAll()
	}
	wait := time.NewTimer(s.cfg.KillGrace + s.cfg.DrainGrace + time.Second)
	defer wait.Stop()
	select {
	case <-sess.done:
	case <-wait.C:
	case <-r.Context().Done():
	}
	writeJSON(w, http.StatusOK, sess.status())
	return nil
}

// handleStdin writes to the session's stdin.
func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) error {
	// The deadline starts when the request arrives, not when earlier
	// writes to the same session let this one go.
	deadline := time.Now().Add(s.cfg.StdinTimeout)
	sess, err := s.session(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req StdinRequest
	if err := decodeJSON(w, r, &req, maxStdinBody); err != nil {
		return err
	}
	if len(req.Data) > 0 && req.Text != "" {
		return newError(CodeBadRequest, "Set either data or text, not both.")
	}
	data := req.Data
	if req.Text != "" {
		data = []byte(req.Text)
	}
	if err := sess.writeStdin(data, req.EOF, deadline); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sess.status())
	return nil
}

// handleResize changes the PTY window size.
func (s *Server) handleResize(w http.ResponseWriter, r *http.Request) error {
	sess, err := s.session(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req ResizeRequest
	if err := decodeJSON(w, r, &req, maxJSONBody); err != nil {
		return err
	}
	if req.Rows == 0 || req.Cols == 0 || req.Rows > maxTTYDimension || req.Cols > maxTTYDimension {
		return newError(CodeBadRequest, "The rows and cols must be between 1 and %d.", maxTTYDimension)
	}
	if err := sess.resize(req.Rows, req.Cols); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sess.status())
	return nil
}

// validSessionID reports whether a client-chosen session id is acceptable:
// it appears in URLs and logs, so only a safe alphabet.
func validSessionID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
