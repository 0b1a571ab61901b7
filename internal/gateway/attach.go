package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recordings"
)

// DefaultAttachIdle is how long an API client that typed into a command it
// did not open may stay silent before it counts as detached.
const DefaultAttachIdle = time.Minute

// Clients that attach, as command.attach and command.detach name them.
const (
	ClientTerminal = "terminal"
	ClientAPI      = "api"
)

// attachments knows, per console process, who is attached to which
// command: a browser terminal from its connection to its close, an API
// client from its first keystroke into a command someone else opened until
// it has typed nothing for the idle time. Joining someone else's command is
// audited as command.attach and leaving it as command.detach, so the audit
// log says who was at a shell and when, not only what was typed. Keystrokes
// of a known attachment cost a map lookup; only the first one of an API
// client reads the command (to know its opener) and writes the event.
//
// A client that moves between console replicas attaches on each (the
// events are at least once, never missing).
type attachments struct {
	// idle is the API clients' idle time (0: DefaultAttachIdle).
	idle time.Duration

	mu sync.Mutex
	m  map[attachKey]*attachment
}

// attachKey is one principal, through one credential, at one command.
type attachKey struct {
	cmd knownKey
	who recordings.Typist
}

type attachment struct {
	// terminals counts the browser terminals of this key open now; while
	// one is, the key is attached whatever the idle timer says.
	terminals int
	// opener is true for the command's own opener typing through the API:
	// its exec is its attach, so nothing is audited.
	opener bool
	// timer detaches an API client after the idle time.
	timer *time.Timer
	// last is when the API client last typed.
	last time.Time
}

func (t *attachments) idleTime() time.Duration {
	if t.idle > 0 {
		return t.idle
	}
	return DefaultAttachIdle
}

// SetAttachIdle sets how long an API client may stay silent before it is
// detached (tests shorten it).
func (g *Gateway) SetAttachIdle(d time.Duration) {
	g.attached.mu.Lock()
	defer g.attached.mu.Unlock()
	g.attached.idle = d
}

// attachEvent is a command.attach or command.detach event.
func attachEvent(a audit.Actor, m Meta, action string, c recordings.Command, typist recordings.Typist, client, reason string) audit.Event {
	d := map[string]any{"session_id": c.SessionID, "client": client, "credential": typist.Via,
		"opened_by": audit.Actor{Type: c.ActorType, ID: c.ActorID, Name: c.ActorName}}
	if reason != "" {
		d["reason"] = reason
	}
	return audit.Event{Actor: a, SourceIP: m.SourceIP, UserAgent: m.UserAgent, Action: action, Target: c.Target(),
		Decision: audit.Allow, Details: audit.Details(d)}
}

// Attach records that a's browser terminal joined command commandID of a
// session (reconnecting to it, or joining someone else's): command.attach,
// written before the terminal shows or sends anything. Call it once the
// terminal was authorized (Continue).
func (g *Gateway) Attach(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64) error {
	c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
	if err != nil {
		return err
	}
	who := recordings.TypistOf(&a.Principal)
	if c.Ended() {
		// A terminal reconnecting to a command that ended meanwhile gets
		// the output it missed and the end: nothing to attach to.
		return nil
	}
	if err := g.mayTypeInto(ctx, org, a, c, who); err != nil {
		return err
	}
	if _, err := org.Audit.Append(ctx, attachEvent(a.AuditActor(), m, "command.attach", c, who, ClientTerminal, "")); err != nil {
		return durable(err)
	}
	g.holdTerminal(org, who, commandID)
	return nil
}

// mayTypeInto decides, for an API key, typing into a terminal command
// someone else opened: what is typed runs, so the agent's rules decide it
// as they decide a shell of the key's own (execRules). People, and the
// opener, may.
func (g *Gateway) mayTypeInto(ctx context.Context, org Org, a *authz.Actor, c recordings.Command, who recordings.Typist) error {
	if a.Kind != audit.ActorAPIKey || !c.TTY || (c.ActorType == who.Type && c.ActorID == who.ID) {
		return nil
	}
	t, err := resolve(ctx, org, a, c.SessionID, ActStdin, nil)
	if err != nil {
		return err
	}
	_, err = g.execRules(a, t, ExecRequest{Command: c.Command}.Interactive())
	return err
}

// OpenedTerminal notes that a's browser terminal opened command commandID
// (a new shell: its command.exec is its attach), so its keystrokes count
// as attached and its close is recorded as a detach.
func (g *Gateway) OpenedTerminal(org Org, a *authz.Actor, commandID int64) {
	g.holdTerminal(org, recordings.TypistOf(&a.Principal), commandID)
}

func (g *Gateway) holdTerminal(org Org, who recordings.Typist, commandID int64) {
	k := attachKey{cmd: knownKey{db: org.DB, id: commandID}, who: who}
	t := &g.attached
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[attachKey]*attachment{}
	}
	at := t.m[k]
	if at == nil {
		at = &attachment{}
		t.m[k] = at
	}
	at.terminals++
}

// Detach records that a's browser terminal left command commandID, which
// still runs, saying why (command.detach). ended says the command ended:
// its command.end says all there is, and nothing is written.
func (g *Gateway) Detach(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64, reason string, ended bool) error {
	who := recordings.TypistOf(&a.Principal)
	k := attachKey{cmd: knownKey{db: org.DB, id: commandID}, who: who}
	t := &g.attached
	t.mu.Lock()
	if at := t.m[k]; at != nil {
		if at.terminals--; at.terminals <= 0 && at.timer == nil {
			delete(t.m, k)
		}
	}
	t.mu.Unlock()
	if ended {
		return nil
	}
	c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
	if err != nil {
		return err
	}
	if c.Ended() {
		return nil
	}
	_, err = org.Audit.Append(ctx, attachEvent(a.AuditActor(), m, "command.detach", c, who, ClientTerminal, reason))
	return err
}

// typing is called before a stdin write of a through the gateway is
// recorded: an API client typing into a command it did not open attaches
// (command.attach, written first) and stays attached until it was silent
// for the idle time. Browser terminals attached themselves already. An API
// key typing into a terminal someone else opened is decided by the
// agent's rules as its own shell would be (execRules).
func (g *Gateway) typing(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64) error {
	who := recordings.TypistOf(&a.Principal)
	k := attachKey{cmd: knownKey{db: org.DB, id: commandID}, who: who}
	t := &g.attached
	now := g.now()
	t.mu.Lock()
	if at := t.m[k]; at != nil {
		at.last = now
		t.mu.Unlock()
		return nil
	}
	t.mu.Unlock()
	c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
	if err != nil {
		return durable(err)
	}
	opener := c.ActorType == who.Type && c.ActorID == who.ID
	if !c.Ended() {
		if err := g.mayTypeInto(ctx, org, a, c, who); err != nil {
			return err
		}
	}
	if !opener && !c.Ended() {
		if _, err := org.Audit.Append(ctx, attachEvent(a.AuditActor(), m, "command.attach", c, who, ClientAPI, "")); err != nil {
			return durable(err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[attachKey]*attachment{}
	}
	if at := t.m[k]; at != nil {
		// Two first keystrokes at once: the other one registered it.
		at.last = now
		return nil
	}
	at := &attachment{opener: opener, last: now}
	t.m[k] = at
	actor, idle := a.AuditActor(), t.idleTime()
	check := func() {
		t.mu.Lock()
		if t.m[k] != at {
			t.mu.Unlock()
			return
		}
		if quiet := g.now().Sub(at.last); quiet < idle {
			at.timer.Reset(idle - quiet)
			t.mu.Unlock()
			return
		}
		at.timer = nil
		if at.terminals == 0 {
			delete(t.m, k)
		}
		t.mu.Unlock()
		if at.opener {
			return
		}
		g.apiDetached(org, actor, m, c, who, idle)
	}
	at.timer = time.AfterFunc(idle, check)
	return nil
}

// apiDetached records an API client's detach from c after it was silent
// for idle, or because c ended meanwhile (then its end says it all).
func (g *Gateway) apiDetached(org Org, actor audit.Actor, m Meta, c recordings.Command, who recordings.Typist, idle time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	now, err := recordings.Get(ctx, org.DB, c.ID)
	if err != nil {
		g.logger().Warn("recording an API client's detach failed", "org", org.Slug, "command", c.ID, "error", err)
		return
	}
	if now.Ended() {
		return
	}
	reason := "nothing typed for " + idle.String()
	if _, err := org.Audit.Append(ctx, attachEvent(actor, m, "command.detach", now, who, ClientAPI, reason)); err != nil {
		g.logger().Warn("recording an API client's detach failed", "org", org.Slug, "command", c.ID, "error", err)
	}
}
