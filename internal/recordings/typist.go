package recordings

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/authz"
)

// Typist is who wrote a piece of a command's input: the principal, as the
// audit log names actors, and the credential it came through. Every stdin
// frame records its typist as the frame's first chunk (stream StreamTypist),
// inside the input chain: changing who is said to have typed breaks the
// chain as changing what was typed does.
type Typist struct {
	// Type, ID and Name are the audit actor's (a user by email, an API key
	// by name and prefix, a platform admin).
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
	// Via is the credential: "api_key:<id>" for an API key, "login:<ref>"
	// for a sign-in (browser cookie or bearer token). A sign-in's ref is
	// the first 12 hex digits of the SHA-256 of its id: the same sign-in
	// has the same ref, and the id itself, which the sign-in's token
	// carries, is never written where recordings travel.
	Via string `json:"via,omitempty"`
}

// TypistOf is the typist a principal is.
func TypistOf(p *authz.Principal) Typist {
	if p == nil {
		return Typist{}
	}
	return Typist{Type: p.Kind, ID: p.ID, Name: p.Name, Via: viaOf(p)}
}

// viaOf names the credential p came through (see Typist.Via).
func viaOf(p *authz.Principal) string {
	switch {
	case p.KeyID != 0:
		return "api_key:" + strconv.FormatInt(p.KeyID, 10)
	case p.LoginID != "":
		sum := sha256.Sum256([]byte(p.LoginID))
		return "login:" + hex.EncodeToString(sum[:6])
	}
	return ""
}

// Same reports whether t and o are the same principal through the same
// credential.
func (t Typist) Same(o Typist) bool { return t == o }

// Label is how exports name the typist: "mia@acme.test (user 3, via
// login:0a1b2c3d4e5f)".
func (t Typist) Label() string {
	s := t.Name + " (" + t.Type + " " + t.ID
	if t.Via != "" {
		s += ", via " + t.Via
	}
	return s + ")"
}

// Opener is the typist of command c's opener: who ran it.
func Opener(c Command) Typist {
	return Typist{Type: c.ActorType, ID: c.ActorID, Name: c.ActorName, Via: c.ActorVia}
}

func encodeTypist(t Typist) []byte {
	b, _ := json.Marshal(t) // strings only: cannot fail
	return b
}

func decodeTypist(b []byte) (Typist, bool) {
	var t Typist
	return t, json.Unmarshal(b, &t) == nil && t.Type != ""
}

// TypistBefore is who typed into command commandID last at or before at:
// the typist of the last stdin frame stored by then, or the command's
// opener when nothing was typed yet (or only before typists were
// recorded). It reads one frame.
func TypistBefore(ctx context.Context, db *gorm.DB, commandID int64, at time.Time) (Typist, error) {
	// Chunk times are kept to the microsecond; a frame's own time may be
	// finer (SQLite) or rounded (Postgres): compare at that grain.
	until := at.UTC().Truncate(time.Microsecond).Add(time.Microsecond)
	var fs []frame
	err := db.WithContext(ctx).Where("command_id = ? AND kind = ? AND started_at < ?", commandID, KindIn, until).
		Order("first_seq DESC").Limit(1).Find(&fs).Error
	if err != nil {
		return Typist{}, fmt.Errorf("read the typist of command %d: %w", commandID, err)
	}
	if len(fs) == 1 {
		cs, err := decodeFrame(fs[0].Body)
		if err != nil {
			return Typist{}, &frameError{commandID: commandID, firstSeq: fs[0].FirstSeq, err: err}
		}
		if len(cs) > 0 && cs[0].Stream == StreamTypist {
			if t, ok := decodeTypist(cs[0].Data); ok {
				return t, nil
			}
		}
	}
	c, err := Get(ctx, db, commandID)
	if err != nil {
		return Typist{}, err
	}
	return Opener(c), nil
}

// TypistChange is a moment a command's input began to come from another
// typist (the first typist included).
type TypistChange struct {
	At     time.Time
	Seq    uint64
	Typist Typist
}

// TypistChanges lists where command id's typist changes, in order: the
// first typist, then each frame whose typist differs from the one before.
// It reads the whole input chain (exports read the whole recording anyway)
// but keeps only the changes.
func TypistChanges(ctx context.Context, db *gorm.DB, id int64) ([]TypistChange, error) {
	var out []TypistChange
	err := eachFrame(ctx, db, id, KindIn, math.MinInt64, func(_ frame, cs []Chunk) error {
		for _, c := range cs {
			if c.Stream != StreamTypist {
				continue
			}
			t, ok := decodeTypist(c.Data)
			if ok && (len(out) == 0 || !out[len(out)-1].Typist.Same(t)) {
				out = append(out, TypistChange{At: c.At, Seq: c.Seq, Typist: t})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
