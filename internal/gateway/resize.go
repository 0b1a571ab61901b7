package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// resizeEvery is how often at most one command's window changes are
// recorded: dragging a window's corner sends hundreds of them, and each
// would otherwise be an audit event.
const resizeEvery = time.Second

// resizeWindows coalesces the window changes of each command. The first
// change is recorded and forwarded at once and opens a window of
// resizeEvery; changes that arrive while it is open are held, the last one
// winning, and when it closes the last is recorded (one command.resize
// event, saying how many changes it stands for), forwarded, and opens the
// next window. A window with nothing held ends. So a change still never
// reaches agentd before its record, agentd ends with the last size asked
// for, and a command gets at most one event a second per console process.
//
// Nothing runs between changes: a window is a timer, and the goroutine of
// its flush ends with the flush.
type resizeWindows struct {
	// every is the window's length (0: resizeEvery); tests shorten it.
	every time.Duration

	mu   sync.Mutex
	open map[knownKey]*resizeWindow
}

// resizeWindow is one command's open window.
type resizeWindow struct {
	held *heldResize
	// n counts the changes held since the last record.
	n int
}

// heldResize is one window change, authorized, with what recording and
// forwarding it need.
type heldResize struct {
	org        Org
	actor      *authz.Actor
	meta       Meta
	target     sessions.Target
	command    recordings.Command
	rows, cols uint16
}

func (w *resizeWindows) window() time.Duration {
	if w.every > 0 {
		return w.every
	}
	return resizeEvery
}

// hold keeps r when its command's window is open and reports whether it
// did; otherwise it opens the window, and the caller applies r and then
// calls reopen.
func (w *resizeWindows) hold(k knownKey, r heldResize) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if win, ok := w.open[k]; ok {
		win.held = &r
		win.n++
		return true
	}
	if w.open == nil {
		w.open = map[knownKey]*resizeWindow{}
	}
	w.open[k] = &resizeWindow{}
	return false
}

// reopen starts k's window once a change was applied: flush runs when it
// closes.
func (w *resizeWindows) reopen(k knownKey, flush func(knownKey)) {
	time.AfterFunc(w.window(), func() { flush(k) })
}

// take hands over what k's closing window holds, and how many changes it
// stands for; with nothing held the window ends (ok false). With ok the
// window stays open until reopen or end.
func (w *resizeWindows) take(k knownKey) (r heldResize, n int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	win := w.open[k]
	if win == nil {
		return heldResize{}, 0, false
	}
	if win.held == nil {
		delete(w.open, k)
		return heldResize{}, 0, false
	}
	r, n = *win.held, win.n
	win.held, win.n = nil, 0
	return r, n, true
}

// end forgets k's window and whatever it holds.
func (w *resizeWindows) end(k knownKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.open, k)
}

// pending is the number of open windows (for tests).
func (w *resizeWindows) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.open)
}

// Resize changes a TTY command's window, recorded before it is forwarded.
// A change within a second of the command's last recorded one is held and
// applied when the second is over (see resizeWindows); the caller is not
// kept waiting for it, and is told of no error the held change meets
// later (those are logged).
func (g *Gateway) Resize(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64, rows, cols uint16) error {
	t, c, err := g.running(ctx, org, a, sessionID, commandID, ActResize)
	if err != nil {
		return err
	}
	k := knownKey{org.DB, c.ID}
	r := heldResize{org: org, actor: a, meta: m, target: t, command: c, rows: rows, cols: cols}
	if g.resizes.hold(k, r) {
		return nil
	}
	defer g.resizes.reopen(k, g.flushResize)
	return g.applyResize(ctx, r, 0)
}

// applyResize records r (standing for n held changes, 0 when it was not
// held) and then forwards it.
func (g *Gateway) applyResize(ctx context.Context, r heldResize, n int) error {
	details := map[string]any{"rows": r.rows, "cols": r.cols}
	if n > 0 {
		details["coalesced"] = n
	}
	if _, err := r.org.Audit.Append(ctx, event(r.actor, r.meta, "command.resize", r.command.Target(), details)); err != nil {
		return durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	if err := g.client(r.target).Resize(fctx, r.command.AgentdID, r.rows, r.cols); err != nil {
		return g.commandUpstream(ctx, r.org, r.target, r.command, err)
	}
	return nil
}

// flushResize applies what k's closing window holds. A command that
// ended meanwhile, or an org revoked meanwhile, drops it: there is no
// window left to change.
func (g *Gateway) flushResize(k knownKey) {
	r, n, ok := g.resizes.take(k)
	if !ok {
		return
	}
	ctx, cancel := tenant.BindRevoked(context.Background(), r.org.Revoked)
	defer cancel()
	c, err := recordings.Get(ctx, r.org.DB, r.command.ID)
	if err != nil || c.Ended() {
		g.resizes.end(k)
		if err != nil && ctx.Err() == nil {
			g.logger().Warn("gateway: a held resize was dropped: its command could not be read", "org", r.org.Slug, "command", r.command.ID, "error", err)
		}
		return
	}
	defer g.resizes.reopen(k, g.flushResize)
	if err := g.applyResize(ctx, r, n); err != nil {
		log := g.logger().Warn
		if errors.Is(err, apperr.ErrConflict) {
			// The command ended before its end was recorded: nothing
			// is wrong.
			log = g.logger().Debug
		}
		log("gateway: a held resize could not be applied", "org", r.org.Slug, "command", r.command.ID,
			"rows", r.rows, "cols", r.cols, "error", err)
	}
}
