package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Config sizes a benchmark run.
type Config struct {
	// Runs is how many execs and keystrokes are timed per path.
	Runs int
	// OutputBytes is the size of each throughput run.
	OutputBytes int64
	// Polls is how many idle long-polls the memory run holds open.
	Polls int
	// Profile counts database round trips per request after the timed
	// runs (ProfileRuns execs and keystrokes).
	ProfileRuns int
	// Text is the repeated line of the compressible output.
	Text string
	// Followed is how many quiet commands the followed-commands run
	// starts (0: 2000; negative: none), and IdleWindow how long it reads
	// the console's CPU while they run (0: 30 s).
	Followed   int
	IdleWindow time.Duration
}

// Defaults fill a zero Config.
func (c Config) withDefaults() Config {
	if c.Runs <= 0 {
		c.Runs = 300
	}
	if c.OutputBytes <= 0 {
		c.OutputBytes = 256 << 20
	}
	if c.Polls <= 0 {
		c.Polls = 2000
	}
	if c.Followed == 0 {
		c.Followed = 2000
	}
	if c.IdleWindow <= 0 {
		c.IdleWindow = 30 * time.Second
	}
	if c.Text == "" {
		c.Text = "some repetitive line of text from a build log, again and again"
	}
	return c
}

// Result is one database's figures.
type Result struct {
	Dialect            store.Dialect
	ExecDirect, ExecGW []time.Duration
	KeyDirect, KeyGW   []time.Duration
	// ExecRecord and KeyRecord are how long the gateway's timed execs and
	// keystrokes above took to commit their records (not the warm-ups';
	// a keystroke's untimed line end is one too): the part of the
	// gateway's time that durability, not the gateway's code, costs.
	ExecRecord, KeyRecord []time.Duration
	Outputs               []OutputResult
	Memory                Memory
	Followed              *Followed
	ProfileText           string
}

// OutputResult is one throughput run on both paths.
type OutputResult struct {
	Kind            string
	Direct, Gateway Throughput
	Recording       Recording
}

// Recording is what the gateway stored of a throughput run.
type Recording struct {
	State         string
	OutBytes      int64
	DroppedBytes  int64
	Truncated     bool
	Frames        int64
	StoredBytes   int64
	Lag           time.Duration
	Complete      bool
	WaitedTooLong bool
}

// Run measures one database: the stack must be fresh.
func Run(ctx context.Context, s *Stack, cfg Config, progress io.Writer) (*Result, error) {
	cfg = cfg.withDefaults()
	r := &Result{Dialect: s.Dialect}
	direct, gw := DirectPath{s.Direct}, GatewayPath{S: s}
	step := func(what string) { fmt.Fprintf(progress, "  [%s] %s\n", s.Dialect, what) }

	// Direct and gateway runs alternate, so load from elsewhere on the
	// machine (it is shared) weighs on both alike.
	step(fmt.Sprintf("exec `true` ×%d per path, interleaved", cfg.Runs))
	stopCPU, err := s.cpuProfile("")
	if err != nil {
		return r, err
	}
	r.ExecDirect, r.ExecGW, r.ExecRecord, err = s.timeRecorded(ctx, gateway.RecordedExec, cfg.Runs,
		func() (time.Duration, error) { return ExecTrue(ctx, direct) },
		func() (time.Duration, error) { return ExecTrue(ctx, gw) })
	stopCPU()
	if err != nil {
		return r, err
	}
	s.settle(ctx)

	step(fmt.Sprintf("keystroke round trip ×%d per path, interleaved", cfg.Runs))
	tyD, err := NewTypist(ctx, direct)
	if err != nil {
		return r, err
	}
	tyG, err := NewTypist(ctx, gw)
	if err != nil {
		_ = tyD.Close(ctx)
		return r, err
	}
	stopCPU, err = s.cpuProfile(".keystroke")
	if err != nil {
		_ = tyD.Close(ctx)
		_ = tyG.Close(ctx)
		return r, err
	}
	r.KeyDirect, r.KeyGW, r.KeyRecord, err = s.timeRecorded(ctx, gateway.RecordedStdin, cfg.Runs,
		func() (time.Duration, error) { return tyD.Key(ctx) },
		func() (time.Duration, error) { return tyG.Key(ctx) })
	stopCPU()
	_ = tyD.Close(ctx)
	_ = tyG.Close(ctx)
	if err != nil {
		return r, err
	}
	s.settle(ctx)

	for _, kind := range []struct{ name, cmd string }{
		{"compressible text", fmt.Sprintf("yes %s | head -c %d", shellQuote(cfg.Text), cfg.OutputBytes)},
		{"random base64", fmt.Sprintf("head -c %d /dev/urandom | base64", cfg.OutputBytes*3/4)},
	} {
		step(fmt.Sprintf("output %s, %s per path", kind.name, mib(cfg.OutputBytes)))
		o := OutputResult{Kind: kind.name}
		if o.Direct, err = ReadAll(ctx, directLossless{direct}, kind.cmd); err != nil {
			return r, err
		}
		stopCPU, err := s.cpuProfile(".output-" + strings.ReplaceAll(kind.name, " ", "-"))
		if err != nil {
			return r, err
		}
		o.Gateway, err = ReadAll(ctx, gw, kind.cmd)
		if err != nil {
			stopCPU()
			return r, err
		}
		o.Recording, err = s.recording(ctx, o.Gateway)
		stopCPU()
		if err != nil {
			return r, err
		}
		r.Outputs = append(r.Outputs, o)
		s.settle(ctx)
	}

	step(fmt.Sprintf("console memory with %d idle long-polls", cfg.Polls))
	if r.Memory, err = s.IdlePolls(ctx, cfg.Polls); err != nil {
		return r, err
	}
	s.settle(ctx)

	if cfg.Followed > 0 {
		step(fmt.Sprintf("%d followed quiet commands: memory, CPU over %s, exec meanwhile", cfg.Followed, cfg.IdleWindow))
		f, err := s.FollowedCommands(ctx, cfg.Followed, cfg.IdleWindow, min(cfg.Runs, 100))
		if err != nil {
			return r, err
		}
		r.Followed = &f
	}

	if cfg.ProfileRuns > 0 {
		step(fmt.Sprintf("profile: database round trips over %d execs and keystrokes", cfg.ProfileRuns))
		if r.ProfileText, err = s.profile(ctx, cfg.ProfileRuns); err != nil {
			return r, err
		}
	}
	return r, nil
}

// directLossless runs commands on agentd with a blocking buffer, so the
// direct reader gets every byte: the ceiling the gateway is held to.
type directLossless struct{ DirectPath }

func (d directLossless) Exec(ctx context.Context, req agentd.CreateSessionRequest) (string, output, error) {
	req.Overflow = agentd.OverflowBlock
	return d.DirectPath.Exec(ctx, req)
}

// timeRecorded is timePairs for runs whose gateway side (b) records op:
// it also returns how long the timed runs' records took to commit, not
// the warm-ups' (slower, and not among the runs they are printed with).
func (s *Stack) timeRecorded(ctx context.Context, op string, n int, a, b func() (time.Duration, error)) (da, db, rec []time.Duration, err error) {
	da, db, err = timePairs(ctx, n, a, b, func() { s.records.take(op) })
	return da, db, s.records.take(op), err
}

// timePairs times a and b n times each, alternating which goes first,
// after warming both up; timed, when set, is called between the two.
func timePairs(ctx context.Context, n int, a, b func() (time.Duration, error), timed func()) ([]time.Duration, []time.Duration, error) {
	for range min(20, n) {
		if _, err := a(); err != nil {
			return nil, nil, err
		}
		if _, err := b(); err != nil {
			return nil, nil, err
		}
	}
	if timed != nil {
		timed()
	}
	da, db := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return da, db, err
		}
		first, second, fo, so := a, b, &da, &db
		if i%2 == 1 {
			first, second, fo, so = b, a, &db, &da
		}
		d, err := first()
		if err != nil {
			return da, db, err
		}
		*fo = append(*fo, d)
		if d, err = second(); err != nil {
			return da, db, err
		}
		*so = append(*so, d)
	}
	return da, db, nil
}

// cpuProfile starts a CPU profile of this process (the console, and the
// benchmark's client) into s.CPUProfile plus suffix when set; call the
// result to stop.
func (s *Stack) cpuProfile(suffix string) (func(), error) {
	if s.CPUProfile == "" {
		return func() {}, nil
	}
	f, err := os.Create(s.CPUProfile + suffix)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// settle waits for the recording followers to finish, so one phase's
// background work does not land in the next one's figures.
func (s *Stack) settle(ctx context.Context) {
	deadline := time.Now().Add(2 * time.Minute)
	for s.Console.Gateway.Followers.Active() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}

// recording waits until the command of t is recorded as ended and reads
// what was stored.
func (s *Stack) recording(ctx context.Context, t Throughput) (Recording, error) {
	db, release, err := s.OrgDB(ctx)
	if err != nil {
		return Recording{}, err
	}
	defer release()
	id, err := strconv.ParseInt(t.ID, 10, 64)
	if err != nil {
		return Recording{}, err
	}
	start := time.Now()
	var c recordings.Command
	for {
		if c, err = recordings.Get(ctx, db, id); err != nil {
			return Recording{}, err
		}
		if c.Ended() {
			break
		}
		if time.Since(start) > 3*time.Minute {
			return Recording{State: c.State, WaitedTooLong: true, Lag: time.Since(start)}, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec := Recording{State: c.State, OutBytes: c.OutBytes, DroppedBytes: c.DroppedBytes, Truncated: c.Truncated, Lag: time.Since(start)}
	row := db.WithContext(ctx).Raw("SELECT count(*), coalesce(sum(length(body)), 0) FROM recording_frames WHERE command_id = ? AND kind = ?", id, recordings.KindOut).Row()
	if err := row.Scan(&rec.Frames, &rec.StoredBytes); err != nil {
		return rec, fmt.Errorf("read recording size: %w", err)
	}
	rec.Complete = c.State == recordings.StateExited && !c.Truncated && c.OutBytes == t.Bytes && t.Dropped == 0
	return rec, nil
}

// profile counts the round trips of execs, keystrokes (stdin and the
// output polls that read the echo) and of the followers behind them.
func (s *Stack) profile(ctx context.Context, n int) (string, error) {
	if err := s.Instrument(ctx); err != nil {
		return "", err
	}
	gw := GatewayPath{S: s}
	// Warm the caches first, then count from a clean slate.
	for range 10 {
		if _, err := ExecTrue(ctx, gw); err != nil {
			return "", err
		}
	}
	s.settle(ctx)
	s.Profile.Reset(true)
	for range n {
		if _, err := ExecTrue(ctx, gw); err != nil {
			return "", err
		}
	}
	s.settle(ctx)
	var b bytesWriter
	fmt.Fprintf(&b, "execs of `true` (followers counted as background):\n")
	s.Profile.Print(&b, map[string]int{"background": n})
	ty, err := NewTypist(ctx, gw)
	if err != nil {
		return "", err
	}
	for range 10 {
		if _, err := ty.Key(ctx); err != nil {
			return "", err
		}
	}
	fmt.Fprintf(&b, "keystrokes on `cat` (one stdin and its echo's output polls each; background: per keystroke):\n")
	s.Profile.Reset(true)
	for range n {
		if _, err := ty.Key(ctx); err != nil {
			return "", err
		}
	}
	s.Profile.Print(&b, map[string]int{"background": n})
	s.Profile.Reset(false)
	_ = ty.Close(ctx)
	s.settle(ctx)
	return b.String(), nil
}

type bytesWriter struct{ b []byte }

func (w *bytesWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *bytesWriter) String() string { return string(w.b) }

func shellQuote(s string) string {
	out := "'"
	for _, r := range s {
		if r == '\'' {
			out += `'\''`
		} else {
			out += string(r)
		}
	}
	return out + "'"
}

func mib(n int64) string {
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', -1, 64) + " MiB"
}

// Percentile returns the p-th percentile (0..100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// Machine describes where the figures were taken.
func Machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, %d CPUs, %s %s/%s", filepath.Base(host), runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
