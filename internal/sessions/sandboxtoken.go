package sessions

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sealed"
)

// Which agentd token a session's sandbox takes (Session.AgentdTokenKind).
const (
	// TokenPerSandbox: the sandbox's agentd was rekeyed to a token of its
	// own, held sealed on the session; the template's token opens it no
	// more.
	TokenPerSandbox = "per_sandbox"
	// TokenTemplate: the sandbox's agentd is too old to be rekeyed (no
	// POST /v1/token), so it takes the template's token, shared by every
	// sandbox of the template.
	TokenTemplate = "template"
)

// rekeyWait bounds how long a new sandbox's agentd may take to answer
// the rekey (it may still be starting when the backend reports the
// sandbox created).
const rekeyWait = 30 * time.Second

// errTokenLost says a sandbox's agentd refuses the template's token: it
// was rekeyed by an earlier attempt whose token was never stored (the
// console stopped between the rekey and the attach).
var errTokenLost = errors.New("the sandbox's agentd was rekeyed by an earlier attempt whose token was lost")

// sandboxTokenAD binds a sealed per-sandbox token to its org, session and
// sandbox: copied to another row it does not open.
func (s *Service) sandboxTokenAD(sessionID int64, sandboxID string) string {
	return sealed.AD(s.Org, "session/"+strconv.FormatInt(sessionID, 10)+"/sandbox/"+sandboxID+"/agentd_token")
}

// agentdToken is the token for the session's agentd: the sandbox's own
// when it has one, else the environment's (a host's, or the template's).
func (s *Service) agentdToken(env envs.Environment, sess Session) (string, error) {
	if sess.SandboxMode != agents.SandboxPerSession || sess.SealedAgentdToken == "" || sess.SandboxID == "" {
		return s.Envs.AgentdToken(env)
	}
	b, err := s.Envs.Box.Open(sess.SealedAgentdToken, s.sandboxTokenAD(sess.ID, sess.SandboxID))
	if err != nil {
		return "", fmt.Errorf("open the agentd token of session %d: %w", sess.ID, err)
	}
	return string(b), nil
}

// rekeyed is the outcome of rekeying a new sandbox's agentd.
type rekeyed struct {
	sealed string // the sealed new token; "" with TokenTemplate
	kind   string
}

// rekey gives a new sandbox's agentd a random token of its own before
// anything else reaches it, authenticating with the template's token, and
// returns it sealed. An agentd too old to know rekeys (its own 404) keeps
// the template's token. One that refuses the template's token
// (errTokenLost) or answers anything else fails the start.
func (s *Service) rekey(ctx context.Context, env envs.Environment, sess Session, sb sandbox.Sandbox) (rekeyed, error) {
	template, err := s.Envs.AgentdToken(env)
	if err != nil {
		return rekeyed{}, err
	}
	c := agentd.NewClient(addressing(env).AgentdURL(sb), template, envs.ClientFor(s.Envs.HTTPClient, env))
	token := rand.Text() + rand.Text() // 52 characters, 260 bits
	// Rekey even if the caller left, as attach does: the sandbox exists,
	// and one left with the template's token must not be adopted later.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rekeyWait)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		err = c.Rekey(rctx, token)
		// Only agentd's own answer (not a proxy's in front of it) says
		// the sandbox was rekeyed before; err need not be an *agentd.Error.
		var ae *agentd.Error
		answered := errors.As(err, &ae) && !ae.Foreign
		switch {
		case err == nil:
			st, serr := s.Envs.Box.Seal([]byte(token), s.sandboxTokenAD(sess.ID, sb.ID))
			if serr != nil {
				return rekeyed{}, fmt.Errorf("seal the agentd token of session %d: %w", sess.ID, serr)
			}
			return rekeyed{sealed: st, kind: TokenPerSandbox}, nil
		case errors.As(err, &ae) && ae.Unknown():
			return rekeyed{kind: TokenTemplate}, nil
		case answered && errors.Is(err, agentd.ErrUnauthorized), errors.Is(err, agentd.ErrAlreadyRekeyed):
			return rekeyed{}, errTokenLost
		case !agentd.Unanswered(err):
			code := "no answer it could read"
			if ae != nil {
				code = ae.Code
			}
			return rekeyed{}, apperr.New(apperr.ErrUpstream, "sandbox_rekey_failed",
				"The new sandbox's agentd refused to take a token of its own (%s); the sandbox was not used.", code)
		}
		// No answer yet: agentd may still be starting.
		select {
		case <-rctx.Done():
			return rekeyed{}, apperr.WithCause(apperr.New(apperr.ErrUpstream, "sandbox_rekey_failed",
				"The new sandbox's agentd did not answer within %s to take a token of its own; the sandbox was not used.", rekeyWait), err)
		case <-time.After(wait):
		}
		wait = min(wait*2, 2*time.Second)
	}
}

// rekeyOrReplace rekeys the sandbox createOrFind returned. An adopted
// sandbox (found by tag after a lost answer) whose agentd refuses the
// template's token was rekeyed by an attempt that never stored its token:
// nothing can reach it any more, so it is killed and a new sandbox
// created in its place, once. Any other failure kills the sandbox too:
// a sandbox the console cannot hold the only key to is never used.
func (s *Service) rekeyOrReplace(ctx context.Context, env envs.Environment, sess Session, b sandbox.Backend, ag agents.Agent, sb sandbox.Sandbox, adopted bool) (sandbox.Sandbox, bool, rekeyed, error) {
	if !sandbox.SafeAddress(sb) {
		// attach kills it and says why.
		return sb, adopted, rekeyed{}, nil
	}
	rk, err := s.rekey(ctx, env, sess, sb)
	if errors.Is(err, errTokenLost) && adopted {
		slog.Default().Warn("replace an adopted sandbox whose agentd token was lost", "org", s.Org, "session", sess.ID, "sandbox", sb.ID)
		s.killQuietly(ctx, b, sess, sb)
		req, rerr := s.createRequest(ctx, sess, ag)
		if rerr != nil {
			return sb, false, rekeyed{}, rerr
		}
		if sb, err = b.Create(ctx, req); err != nil {
			return sb, false, rekeyed{}, backendError("create the session's sandbox", err)
		}
		if !sandbox.SafeAddress(sb) {
			return sb, false, rekeyed{}, nil
		}
		adopted = false
		rk, err = s.rekey(ctx, env, sess, sb)
	}
	if err != nil {
		s.killQuietly(ctx, b, sess, sb)
		if errors.Is(err, errTokenLost) {
			err = apperr.New(apperr.ErrUpstream, "sandbox_rekey_failed",
				"The new sandbox's agentd refused the template's token before the console gave it one of its own; the sandbox was killed.")
		}
		return sb, adopted, rekeyed{}, err
	}
	return sb, adopted, rk, nil
}

func (s *Service) killQuietly(ctx context.Context, b sandbox.Backend, sess Session, sb sandbox.Sandbox) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if err := b.Kill(kctx, sb.ID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		slog.Default().Warn("kill a sandbox that could not be rekeyed", "org", s.Org, "session", sess.ID, "sandbox", sb.ID, "error", err)
	}
}
