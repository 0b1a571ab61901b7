package e2bfake

import (
	"bytes"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Fault is a failure the fake injects into matching API calls, so that a
// caller's handling of a misbehaving backend can be tested against the
// real HTTP exchange: 500s, 503 with Retry-After, slow answers, answers
// that never come, malformed bodies, and calls that took effect although
// their answer was lost.
type Fault struct {
	// Route is a route as registered and counted by Calls, e.g.
	// "POST /sandboxes" or "GET /v2/sandboxes"; empty matches every API
	// route (never the proxy).
	Route string
	// Times is how many matching calls the fault spoils; zero means every
	// one until it is removed.
	Times int
	// Delay holds the answer back this long (less if the client gives
	// up first).
	Delay time.Duration
	// Hang holds the answer until the client gives up or the fake closes,
	// then drops the connection: a backend that never answers.
	Hang bool
	// Status, when set, replaces the answer's status; with Body empty the
	// body is E2B's error shape {code, message}.
	Status int
	// RetryAfter sets the Retry-After header (whole seconds, rounded up).
	RetryAfter time.Duration
	// Body replaces the answer's body verbatim (malformed JSON, an HTML
	// error page); with Status zero the real status is kept.
	Body string
	// AfterHandler lets the call take effect first and spoils only its
	// answer. With Hang (or a Delay longer than the client waits) it is
	// "the backend accepted the create but the answer never arrived";
	// with Status 502 or a malformed Body, an answer lost on the way.
	AfterHandler bool
}

// InjectFault adds a fault and returns a func that removes it. Faults are
// matched in the order they were added; the first one with calls left
// applies.
func (s *Server) InjectFault(f Fault) (remove func()) { return s.faults.add(f) }

// ClearFaults removes every injected fault.
func (s *Server) ClearFaults() { s.faults.clear() }

type activeFault struct {
	Fault
	left int // calls left; negative: unlimited
}

type faultSet struct {
	mu   sync.Mutex
	list []*activeFault
}

func (fs *faultSet) add(f Fault) func() {
	af := &activeFault{Fault: f, left: f.Times}
	if f.Times <= 0 {
		af.left = -1
	}
	fs.mu.Lock()
	fs.list = append(fs.list, af)
	fs.mu.Unlock()
	return func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		for i, x := range fs.list {
			if x == af {
				fs.list = append(fs.list[:i], fs.list[i+1:]...)
				return
			}
		}
	}
}

func (fs *faultSet) clear() {
	fs.mu.Lock()
	fs.list = nil
	fs.mu.Unlock()
}

// take returns the fault that applies to a call of route, counting it.
func (fs *faultSet) take(route string) (Fault, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range fs.list {
		if (f.Route == "" || f.Route == route) && f.left != 0 {
			if f.left > 0 {
				f.left--
			}
			return f.Fault, true
		}
	}
	return Fault{}, false
}

// faulty applies injected faults to one route's handler.
func (s *Server) faulty(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := s.faults.take(route)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		spoils := f.Status != 0 || f.Body != ""
		if !f.AfterHandler {
			s.hold(r, f)
			if spoils {
				spoil(w, f, http.StatusOK)
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		s.hold(r, f)
		if spoils {
			spoil(w, f, rec.status)
			return
		}
		rec.replay(w)
	})
}

// hold waits out a fault's delay or hang. When the client has gone, or
// the fault hangs, it drops the connection without an answer.
func (s *Server) hold(r *http.Request, f Fault) {
	var wait <-chan time.Time
	if f.Delay > 0 && !f.Hang {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		wait = t.C
	} else if !f.Hang {
		return
	}
	select {
	case <-wait:
		return
	case <-r.Context().Done():
	case <-s.stop:
	}
	panic(http.ErrAbortHandler)
}

// spoil writes a fault's answer in place of the real one (whose status was
// real).
func spoil(w http.ResponseWriter, f Fault, real int) {
	status := f.Status
	if status == 0 {
		status = real
	}
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((f.RetryAfter+time.Second-1)/time.Second)))
	}
	if f.Body == "" {
		writeError(w, status, "Injected fault: "+http.StatusText(status))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(f.Body))
}

// recorder keeps a handler's answer so a fault can replace it after the
// call took effect.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

func (r *recorder) replay(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
