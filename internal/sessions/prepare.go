package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/envs"
)

// Preparation statuses of a session's workspace.
const (
	// PrepPrepared: every skill and file was placed and proven by one
	// batch stat.
	PrepPrepared = "prepared"
	// PrepFailed: an item could not be placed or proven; the session went
	// back to pending and no command ran.
	PrepFailed = "failed"
)

// Item statuses.
const (
	ItemVerified    = "verified"
	ItemFailed      = "failed"
	ItemNotVerified = "not verified"
)

// PrepItem is one skill or file of a preparation, as shown on the session's
// page and API and in the session.prepare audit event (never contents).
type PrepItem struct {
	Kind   string `json:"kind"` // skill or file
	Name   string `json:"name"`
	Source string `json:"source"`
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// Files is the number of entries an archive unpacked into (0 for a
	// single file).
	Files  int    `json:"files,omitempty"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// Preparation is what was put in a session's workspace and proven there.
type Preparation struct {
	SessionID  int64
	Workspace  string
	SandboxID  string
	Status     string
	Reason     string
	Items      []PrepItem
	PreparedAt *time.Time
	UpdatedAt  time.Time
}

type prepRow struct {
	SessionID  int64 `gorm:"primaryKey"`
	Workspace  string
	SandboxID  string
	Status     string
	Reason     string
	Items      string
	ClaimToken string
	ClaimedAt  *time.Time
	PreparedAt *time.Time
	UpdatedAt  time.Time
}

func (prepRow) TableName() string { return "session_preparations" }

func (r prepRow) preparation() Preparation {
	p := Preparation{SessionID: r.SessionID, Workspace: r.Workspace, SandboxID: r.SandboxID, Status: r.Status, Reason: r.Reason,
		PreparedAt: r.PreparedAt, UpdatedAt: r.UpdatedAt}
	_ = json.Unmarshal([]byte(r.Items), &p.Items)
	return p
}

// preparedFor reports a preparation that succeeded in this workspace and
// sandbox: one recorded for another is stale.
func (r prepRow) preparedFor(key, sandboxID string) bool {
	return r.Status == PrepPrepared && r.Workspace == key && r.SandboxID == sandboxID
}

// Preparation returns the preparation of a session a may see (nil when
// nothing was ever prepared in it).
func (s *Service) Preparation(ctx context.Context, a *authz.Actor, sessionID int64) (*Preparation, error) {
	if _, err := s.visible(ctx, a, sessionID, false); err != nil {
		return nil, err
	}
	row, ok, err := s.prepRow(ctx, sessionID)
	if err != nil || !ok {
		return nil, err
	}
	p := row.preparation()
	return &p, nil
}

// Prepare prepares the workspace of a session a may use again, rewriting
// every skill and file even when it was prepared (the retry after a
// failure, or after someone changed the agent's skills), and returns the
// session: authorized like Start.
func (s *Service) Prepare(ctx context.Context, a *authz.Actor, sessionID int64) (Session, error) {
	sess, err := s.visible(ctx, a, sessionID, true)
	if err != nil {
		return sess, err
	}
	if sess.Final() {
		return sess, finalError(sess)
	}
	if err := s.DB.WithContext(ctx).Table("session_preparations").Where("session_id = ? AND claim_token = ''", sessionID).
		Updates(map[string]any{"status": "", "updated_at": s.now()}).Error; err != nil {
		return sess, fmt.Errorf("mark the preparation stale: %w", err)
	}
	s.rt().forget(s.key(sessionID))
	return s.Start(ctx, a, sessionID)
}

func (s *Service) prepRow(ctx context.Context, sessionID int64) (prepRow, bool, error) {
	var rows []prepRow
	if err := s.DB.WithContext(ctx).Where("session_id = ?", sessionID).Limit(1).Find(&rows).Error; err != nil {
		return prepRow{}, false, fmt.Errorf("read session preparation: %w", err)
	}
	if len(rows) == 0 {
		return prepRow{}, false, nil
	}
	return rows[0], true, nil
}

// workspaceKey names the workspace a session's commands run in now: a
// preparation recorded for another one is stale.
func workspaceKey(sess Session) string {
	switch {
	case sess.WorkspaceMount != "":
		return "mount:" + sess.WorkspaceMount
	case sess.SandboxMode == agents.SandboxPerSession:
		return "sandbox:" + sess.SandboxID
	default:
		return "host:" + sess.Workspace
	}
}

// plannedItem is one thing to place, with what placing it needs.
type plannedItem struct {
	PrepItem
	skill  agents.Skill
	upload *agents.Upload
}

// plan lists what the agent puts in a workspace: its skills (at their
// mount path, default <workspace>/.skills/<name>), then its files.
func plan(ag agents.Agent, uploads []agents.Upload, workspace string) []plannedItem {
	cfg, _ := agents.ParseConfig(ag.Config, apperr.Validation())
	bundles := map[string]*agents.Upload{}
	var out []plannedItem
	for i := range uploads {
		u := &uploads[i]
		if u.Kind == agents.UploadSkill {
			bundles[u.Name] = u
		}
	}
	for _, sk := range cfg.Skills {
		dest := sk.MountPath
		if dest == "" {
			dest = path.Join(workspace, ".skills", sk.Name)
		}
		it := plannedItem{PrepItem: PrepItem{Kind: "skill", Name: sk.Name, Source: sk.Shown(), Path: dest}, skill: sk}
		if name, ok := sk.Uploaded(); ok {
			it.upload = bundles[name]
		}
		out = append(out, it)
	}
	for i := range uploads {
		u := &uploads[i]
		if u.Kind == agents.UploadFile {
			out = append(out, plannedItem{PrepItem: PrepItem{Kind: "file", Name: u.Name, Source: "upload:" + u.Name, Path: path.Join(workspace, u.Name)}, upload: u})
		}
	}
	return out
}

// prepare makes sure the workspace t's commands run in holds the agent's
// skills and files, proven by agentd, before anything runs there. It is a
// step of ensure: once per workspace, whichever replica and however many
// callers race (one claims the session's preparation row, the others wait
// for its outcome). A persistent workspace prepared before is checked in a
// new sandbox with one batch stat, not rewritten. On failure the session
// goes back to pending (its sandbox killed: the half-prepared workspace is
// never used) with the reason, and the error says it.
func (s *Service) prepare(ctx context.Context, a *authz.Actor, t Target) error {
	sess := t.Session
	key := workspaceKey(sess)
	row, ok, err := s.prepRow(ctx, sess.ID)
	if err != nil {
		return err
	}
	c := agentd.NewClient(t.AgentdURL, t.AgentdToken, envs.ClientFor(s.Envs.HTTPClient, t.Environment))
	recheck := false
	if ok && row.preparedFor(key, sess.SandboxID) {
		if sess.SandboxMode == agents.SandboxPerSession {
			return nil
		}
		// A host workspace outlives what the console sees: someone on the
		// host may have removed it. Checked (one batch stat) whenever the
		// session is looked at again, at most once per refresh interval;
		// an agentd that does not answer is the gateway's to report.
		if kept, err := s.stillThere(ctx, c, row); err != nil || kept {
			return nil
		}
		recheck = true
	}
	// Names, sizes and hashes only: each one's bytes are read when it is
	// placed (place), so a preparation holds one upload at a time.
	uploads, err := s.Agents.Uploads(ctx, systemReader(), t.Agent.ID)
	if err != nil {
		return err
	}
	items := plan(t.Agent, uploads, t.Workspace)
	if len(items) == 0 && !ok {
		return nil // nothing to put anywhere, and nothing was ever put
	}
	var token string
	for {
		var won bool
		if token, won, err = s.claimPreparation(ctx, sess.ID); err != nil {
			return err
		}
		if won {
			break
		}
		// Another use prepares: its outcome is this one's, unless it
		// went away without one, and then this use takes over.
		if err := s.awaitPreparation(ctx, sess, key); !errors.Is(err, errPreparerGone) {
			return err
		}
	}
	defer s.releasePreparation(sess.ID, token)
	// Whoever held the claim before may have prepared it meanwhile.
	if row, ok, err = s.prepRow(ctx, sess.ID); err != nil {
		return err
	}
	if !recheck && ok && row.preparedFor(key, sess.SandboxID) {
		return nil
	}
	if ok && row.Status == PrepPrepared && row.Workspace == key && sess.WorkspaceMount != "" {
		// A new sandbox over a persistent workspace prepared before: its
		// files are still there unless someone removed them.
		if kept, err := s.stillThere(ctx, c, row); err == nil && kept {
			return s.recordKept(ctx, sess)
		}
	}
	for i := range items {
		s.place(ctx, c, &items[i])
	}
	failed := ""
	for i, it := range items {
		if it.Status == ItemFailed && failed == "" {
			failed = it.Kind + " " + it.Name + ": " + it.Error
		}
		if it.Status == "" {
			items[i].Status = ItemNotVerified
		}
	}
	if failed == "" && len(items) > 0 {
		failed = s.prove(ctx, c, items)
	}
	if err := ctx.Err(); err != nil && failed != "" {
		return fmt.Errorf("prepare the session's workspace: %w", err) // the caller left: the next use prepares
	}
	return s.recordPreparation(ctx, a, t, key, items, failed)
}

// uploadBytes reads the bytes of it's upload. They must still be the
// ones listed (hash and all): an upload replaced meanwhile fails the item
// rather than place bytes the preparation did not list.
func (s *Service) uploadBytes(ctx context.Context, it *plannedItem, fail func(string, ...any)) ([]byte, bool) {
	u, err := s.Agents.UploadContent(ctx, systemReader(), it.upload.AgentID, it.upload.Kind, it.upload.Name)
	if err != nil {
		fail("the uploaded %s %q could not be read: %s", it.upload.Kind, it.upload.Name, failure(err))
		return nil, false
	}
	if u.SHA256 != it.upload.SHA256 || u.Format != it.upload.Format {
		fail("the uploaded %s %q was replaced during the preparation; prepare again", it.upload.Kind, it.upload.Name)
		return nil, false
	}
	return u.Content, true
}

// place puts one item in the workspace through agentd and records what
// agentd reports (size, hash) or the exact failure.
func (s *Service) place(ctx context.Context, c *agentd.Client, it *plannedItem) {
	fail := func(format string, args ...any) {
		it.Status, it.Error = ItemFailed, clip.String(fmt.Sprintf(format, args...), 300)
	}
	pin := it.skill.SHA256
	switch {
	case it.Kind == "file":
		body, ok := s.uploadBytes(ctx, it, fail)
		if !ok {
			return
		}
		res, err := c.WriteFile(ctx, it.Path, 0o644, bytes.NewReader(body), int64(len(body)))
		if err != nil {
			fail("agentd could not write it: %s", failure(err))
			return
		}
		it.Size, it.SHA256 = res.Size, res.SHA256
		if res.SHA256 != it.upload.SHA256 {
			fail("agentd stored bytes with sha256 %s, not the uploaded %s", res.SHA256, it.upload.SHA256)
			return
		}
	case strings.HasPrefix(it.skill.Source, agents.UploadSource):
		if it.upload == nil {
			fail("no bundle named %q is uploaded to the agent", strings.TrimPrefix(it.skill.Source, agents.UploadSource))
			return
		}
		it.SHA256, it.Size = it.upload.SHA256, it.upload.Size
		if pin != "" && pin != it.upload.SHA256 {
			fail("sha256 mismatch: the uploaded bundle has %s, the skill pins %s", it.upload.SHA256, pin)
			return
		}
		body, ok := s.uploadBytes(ctx, it, fail)
		if !ok {
			return
		}
		res, err := c.WriteArchive(ctx, it.Path, it.upload.Format, bytes.NewReader(body), int64(len(body)))
		if err != nil {
			fail("agentd could not unpack it: %s", failure(err))
			return
		}
		it.Files = res.Files
		if res.SHA256 != it.upload.SHA256 {
			fail("agentd received bytes with sha256 %s, not the uploaded %s", res.SHA256, it.upload.SHA256)
			return
		}
	case strings.HasPrefix(it.skill.Source, "/"):
		res, err := c.Copy(ctx, it.skill.Source, it.Path)
		if err != nil {
			fail("agentd could not copy %s: %s", it.skill.Source, failure(err))
			return
		}
		it.Size, it.SHA256, it.Files = res.Size, res.SHA256, res.Files
	default:
		res, err := c.Fetch(ctx, agentd.FetchRequest{URL: it.skill.Source, Path: it.Path, Unpack: agents.ArchiveFormat(urlPath(it.skill.Source)),
			SHA256: pin, MaxBytes: agents.MaxUploadBytes})
		if err != nil {
			var ae *agentd.Error
			if errors.As(err, &ae) && ae.Code == "checksum_mismatch" {
				fail("sha256 mismatch: %s", ae.Message)
				return
			}
			fail("agentd could not fetch %s: %s", it.Source, failure(err))
			return
		}
		it.Size, it.SHA256, it.Files = res.Size, res.SHA256, res.Files
		if pin != "" && res.SHA256 != pin {
			// An agentd that does not know pins ignores them: checked here too.
			fail("sha256 mismatch: the download has %q, the skill pins %s", res.SHA256, pin)
			return
		}
	}
	it.Status = ""
}

// urlPath is the path of a URL (where its archive suffix is read).
func urlPath(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Path
	}
	return raw
}

// prove asks agentd, in one batch stat, whether every placed item is
// visible; it marks each verified (with the size agentd sees for a file) or
// says what is missing.
func (s *Service) prove(ctx context.Context, c *agentd.Client, items []plannedItem) string {
	paths := make([]string, len(items))
	for i, it := range items {
		paths[i] = it.Path
	}
	stats, err := c.Stat(ctx, paths...)
	if err != nil || len(stats) != len(items) {
		msg := "agentd's batch stat failed"
		if err != nil {
			msg += ": " + failure(err)
		}
		for i := range items {
			items[i].Status, items[i].Error = ItemFailed, msg
		}
		return msg
	}
	failed := ""
	for i, st := range stats {
		it := &items[i]
		switch {
		case !st.Exists:
			it.Status, it.Error = ItemFailed, "not visible in the workspace after it was placed"
		case it.Kind == "file" && st.Size != it.Size:
			it.Status, it.Error = ItemFailed, fmt.Sprintf("agentd sees %d bytes, %d were written", st.Size, it.Size)
		default:
			it.Status = ItemVerified
			if st.Type == "file" {
				it.Size = st.Size
			}
		}
		if it.Status == ItemFailed && failed == "" {
			failed = it.Kind + " " + it.Name + ": " + it.Error
		}
	}
	return failed
}

// stillThere checks with one batch stat that every item of a prepared
// workspace is still there.
func (s *Service) stillThere(ctx context.Context, c *agentd.Client, row prepRow) (bool, error) {
	p := row.preparation()
	if len(p.Items) == 0 {
		return true, nil
	}
	paths := make([]string, len(p.Items))
	for i, it := range p.Items {
		paths[i] = it.Path
	}
	stats, err := c.Stat(ctx, paths...)
	if err != nil || len(stats) != len(paths) {
		return false, err
	}
	for _, st := range stats {
		// Presence only: the agent may have edited its files since, and
		// that is its work, not a missing workspace.
		if !st.Exists {
			return false, nil
		}
	}
	return true, nil
}

// recordKept notes that a persistent workspace was found intact in the
// session's new sandbox: nothing was written, so nothing is audited.
func (s *Service) recordKept(ctx context.Context, sess Session) error {
	now := s.now()
	return s.DB.WithContext(ctx).Table("session_preparations").Where("session_id = ?", sess.ID).
		Updates(map[string]any{"sandbox_id": sess.SandboxID, "reason": "persistent workspace kept: every item found in sandbox " + sess.SandboxID, "updated_at": now}).Error
}

// recordPreparation stores the outcome with its one session.prepare audit
// event. A failure sends the session back to pending (its sandbox killed)
// and comes back as the caller's error.
func (s *Service) recordPreparation(ctx context.Context, a *authz.Actor, t Target, key string, planned []plannedItem, failed string) error {
	sess := t.Session
	items := make([]PrepItem, len(planned))
	for i, it := range planned {
		items[i] = it.PrepItem
	}
	raw, _ := json.Marshal(items)
	now := s.now()
	status, reason := PrepPrepared, fmt.Sprintf("%d item(s) placed and verified", len(items))
	if failed != "" {
		status, reason = PrepFailed, clip.String(failed, 400)
	}
	set := map[string]any{"workspace": key, "sandbox_id": sess.SandboxID, "status": status, "reason": reason, "items": string(raw), "updated_at": now}
	if failed == "" {
		set["prepared_at"] = now
	}
	details := map[string]any{"result": status, "workspace": key, "items": items}
	// Recorded even if the caller left: the workspace was written.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if failed == "" {
		return s.DB.WithContext(dctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Table("session_preparations").Where("session_id = ?", sess.ID).Updates(set).Error; err != nil {
				return fmt.Errorf("record session preparation: %w", err)
			}
			return s.record(dctx, tx, sess, a.AuditActor(), "session.prepare", sess.State, sess.State, reason, details)
		})
	}
	if err := s.DB.WithContext(dctx).Table("session_preparations").Where("session_id = ?", sess.ID).Updates(set).Error; err != nil {
		return fmt.Errorf("record session preparation: %w", err)
	}
	s.rt().forget(s.key(sess.ID))
	updates := map[string]any{}
	if sess.SandboxID != "" {
		// The half-prepared sandbox is never used: the next use (the
		// retry) starts from a fresh one.
		if err := s.killSandbox(dctx, sess); err != nil {
			slog.Default().Warn("kill a sandbox whose preparation failed", "org", s.Org, "session", sess.ID, "error", err)
		}
		updates = unattached()
		details["killed_sandbox"] = sess.SandboxID
	}
	msg := "preparation failed: " + reason
	if _, err := s.transition(dctx, sess, []string{StateRunning}, StatePending, msg, a.AuditActor(), "session.prepare", updates, details); err != nil {
		return err
	}
	return notPrepared(sess.ID, reason)
}

// notPrepared is the refusal of a session whose workspace could not be
// prepared, whether this caller prepared it or waited for another.
func notPrepared(sessionID int64, reason string) error {
	return apperr.New(apperr.ErrConflict, "session_not_prepared",
		"Session %d's workspace could not be prepared, so nothing ran in it: %s. Fix the agent's skills or files (or what they point to) and retry the preparation.", sessionID, reason)
}

// claimPreparation takes the session's preparation claim (creating its
// row first): one caller of any replica prepares, the others wait. A claim
// older than the create lease is a crashed preparer's and is taken over.
func (s *Service) claimPreparation(ctx context.Context, sessionID int64) (string, bool, error) {
	now := s.now()
	if err := s.DB.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).
		Create(&prepRow{SessionID: sessionID, Items: "[]", UpdatedAt: now}).Error; err != nil {
		return "", false, fmt.Errorf("start session preparation: %w", err)
	}
	token := randomToken()
	res := s.DB.WithContext(ctx).Table("session_preparations").
		Where("session_id = ? AND (claim_token = '' OR claimed_at < ?)", sessionID, now.Add(-s.rt().createLease())).
		Updates(map[string]any{"claim_token": token, "claimed_at": now})
	if res.Error != nil {
		return "", false, fmt.Errorf("claim session preparation: %w", res.Error)
	}
	return token, res.RowsAffected == 1, nil
}

// releasePreparation drops this caller's claim.
func (s *Service) releasePreparation(sessionID int64, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.DB.WithContext(ctx).Table("session_preparations").Where("session_id = ? AND claim_token = ?", sessionID, token).
		Updates(map[string]any{"claim_token": "", "claimed_at": nil}).Error
}

// awaitPreparation waits for another caller's preparation of the session
// and answers its outcome: nil once the workspace is prepared, the failure
// otherwise, errPreparerGone when it ended without one.
func (s *Service) awaitPreparation(ctx context.Context, sess Session, key string) error {
	wait := 20 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the session's preparation: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 500*time.Millisecond)
		row, ok, err := s.prepRow(ctx, sess.ID)
		if err != nil {
			return err
		}
		if ok && row.ClaimToken != "" && row.ClaimedAt != nil && s.now().Sub(*row.ClaimedAt) > s.rt().createLease() {
			// The preparer went away mid-way: the waiting use takes over.
			return errPreparerGone
		}
		if !ok || row.ClaimToken != "" {
			continue
		}
		switch {
		case row.Status == PrepPrepared && row.Workspace == key:
			return nil
		case row.Status == PrepFailed:
			return notPrepared(sess.ID, row.Reason)
		}
		// Released without an outcome (the preparer's caller left): the
		// waiting use prepares.
		return errPreparerGone
	}
}

// errPreparerGone says the preparation awaited ended without an outcome:
// the preparer's caller left, or it stopped mid-way.
var errPreparerGone = errors.New("the session's preparer went away")
