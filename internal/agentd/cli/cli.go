// Package cli is agentd's command line: its flags, where its token comes
// from, and serving until a signal. cmd/agentd runs it, and so does the
// console's binary when it is started under the name agentd, which is how
// the console serves agentd for its own platform with no second build.
//
// The bearer token comes from the AGENTD_TOKEN environment variable or from
// --token-file, never from a flag value (which would show in ps). On unix
// agentd then re-executes itself with the token on an inherited pipe and
// without AGENTD_TOKEN or --token-file, so neither /proc/PID/environ nor
// /proc/PID/cmdline names it, and (on Linux) marks itself non-dumpable so
// commands cannot read its memory. The re-executed process keeps its
// argv[0], so a console binary running as agentd stays agentd.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Main runs agentd with the process's arguments and environment and
// exits: with 1 when it failed, 0 when it ended.
func Main() {
	if err := Run(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "agentd: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// IsAgentdName reports whether argv0 (a program's path as started) names
// agentd: its base name is agentd, or agentd.exe on Windows.
func IsAgentdName(argv0 string) bool {
	base := argv0
	if i := strings.LastIndexAny(argv0, `/\`); i >= 0 {
		base = argv0[i+1:] // a Windows path's separators too
	}
	return base == "agentd" || strings.EqualFold(base, "agentd.exe")
}

// options are the command-line settings.
type options struct {
	listen      string
	tokenFile   string
	tokenFD     int
	addrFile    string
	root        string
	maxSessions int
	ringBytes   int
	pollBytes   int
	sessionTTL  time.Duration
	killGrace   time.Duration
	stdinTime   time.Duration
	runAs       string
	cgroup      string
	cgroupDir   string
	execReports string
	memoryMax   int64
	pidsMax     int64
	privFetch   bool
	writeMax    int64
	unpackMax   int64
	unpackFiles int
	hardLinks   bool
	noSpawner   bool
	egress      string
	egressDNS   string
	version     bool

	// explicit lists the flags set on the command line, to re-execute
	// with.
	explicit []*flag.Flag
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("agentd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := getenv("AGENTD_LISTEN")
	if listen == "" {
		listen = fmt.Sprintf(":%d", agentd.DefaultPort)
	}
	fs.StringVar(&o.listen, "listen", listen, "address to listen on (env AGENTD_LISTEN)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (default: env AGENTD_TOKEN)")
	fs.IntVar(&o.tokenFD, "token-fd", -1, "read the bearer token from this inherited file descriptor (used when agentd re-executes itself)")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the bound address to this file once listening")
	fs.StringVar(&o.root, "root", getenv("AGENTD_ROOT"), "confine file operations to this directory; default cwd of commands (env AGENTD_ROOT)")
	fs.IntVar(&o.maxSessions, "max-sessions", agentd.DefaultMaxSessions, "maximum concurrently running sessions")
	fs.IntVar(&o.ringBytes, "ring-bytes", agentd.DefaultRingBytes, "output buffer size per session in bytes (chunk overhead included)")
	fs.IntVar(&o.pollBytes, "poll-bytes", agentd.DefaultPollBytes, "output bytes one poll response carries at most")
	fs.DurationVar(&o.sessionTTL, "session-ttl", agentd.DefaultSessionTTL, "how long ended sessions stay readable")
	fs.DurationVar(&o.killGrace, "kill-grace", agentd.DefaultKillGrace, "wait between SIGTERM and SIGKILL")
	fs.DurationVar(&o.stdinTime, "stdin-timeout", agentd.DefaultStdinTimeout, "how long one stdin request may take, from its arrival")
	fs.StringVar(&o.runAs, "run-as", "", "run commands as this user (name or uid; agentd must run as root)")
	fs.StringVar(&o.cgroup, "cgroup", agentd.CgroupAuto, "cgroup v2 per session: auto, off or required (Linux)")
	fs.StringVar(&o.execReports, "exec-reporting", agentd.ExecReportingAuto, "report the programs started in sessions from the kernel: auto or off (Linux, as root)")
	fs.StringVar(&o.cgroupDir, "cgroup-parent", "", "cgroup v2 directory for the session cgroups (default: agentd's own cgroup)")
	fs.Int64Var(&o.memoryMax, "session-memory-max", 0, "memory.max of each session's cgroup in bytes (0: none; needs cgroups)")
	fs.Int64Var(&o.pidsMax, "session-pids-max", 0, "pids.max of each session's cgroup (0: none; needs cgroups)")
	fs.Int64Var(&o.writeMax, "write-max-bytes", agentd.DefaultWriteMaxBytes, "largest body of a file or archive upload (PUT /v1/files, /v1/files/archive)")
	fs.Int64Var(&o.unpackMax, "unpack-max-bytes", agentd.DefaultUnpackMaxBytes, "most bytes one archive unpacks to, or one copy copies")
	fs.IntVar(&o.unpackFiles, "unpack-max-files", agentd.DefaultUnpackMaxFiles, "most entries of one unpacked archive or copied tree")
	fs.BoolVar(&o.privFetch, "fetch-allow-private-redirects", false, "let downloads follow redirects to loopback, link-local and metadata addresses")
	fs.BoolVar(&o.noSpawner, "no-spawner", false, "start commands from agentd itself rather than from its small helper process (Linux), which keeps a start as fast with thousands of sessions as with none")
	fs.BoolVar(&o.hardLinks, "refuse-hard-links", false, "refuse file reads of files with more than one hard link (automatic with --run-as when fs.protected_hardlinks is off)")
	fs.StringVar(&o.egress, "egress", agentd.EgressAuto, "confine sessions with a network policy: auto (a network namespace each as root, else Landlock), netns, landlock or off (Linux)")
	fs.StringVar(&o.egressDNS, "egress-dns", "", "resolver (host:port) for the names sessions may resolve and the egress proxy dials (default: the host's)")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if o.execReports != agentd.ExecReportingAuto && o.execReports != agentd.ExecReportingDisabled {
		return o, fmt.Errorf("--exec-reporting must be auto or off, not %q", o.execReports)
	}
	switch o.cgroup {
	case agentd.CgroupAuto, agentd.CgroupOff, agentd.CgroupRequired:
	default:
		return o, fmt.Errorf("--cgroup must be auto, off or required, not %q", o.cgroup)
	}
	switch o.egress {
	case agentd.EgressAuto, agentd.EgressNetns, agentd.EgressLandlock, agentd.EgressOff:
	default:
		return o, fmt.Errorf("--egress must be auto, netns, landlock or off, not %q", o.egress)
	}
	fs.Visit(func(f *flag.Flag) { o.explicit = append(o.explicit, f) })
	return o, nil
}

// reexecArgs are the arguments agentd re-executes itself with: the flags
// set explicitly, minus --token-file (its path must not show in
// /proc/PID/cmdline) and --token-fd; reexecClean adds the --token-fd it
// passes the token on.
func reexecArgs(o options) []string {
	var args []string
	for _, f := range o.explicit {
		if f.Name == "token-file" || f.Name == "token-fd" {
			continue
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	}
	return args
}

// lookupRunAs resolves --run-as to credentials and the user's environment.
func lookupRunAs(name string) (*agentd.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var uerr error
		if u, uerr = user.LookupId(name); uerr != nil {
			return nil, fmt.Errorf("--run-as: %w", err)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--run-as: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--run-as: gid %q: %w", u.Gid, err)
	}
	c := &agentd.Credential{
		UID: uint32(uid),
		GID: uint32(gid),
		Env: []string{"HOME=" + u.HomeDir, "USER=" + u.Username, "LOGNAME=" + u.Username},
	}
	// The user's login shell, as login(1) sets it: the browser terminal
	// starts it when it is zsh. os/user does not expose it; a user not in
	// /etc/passwd (NSS, LDAP) gets no SHELL rather than agentd's own.
	if sh := passwdShell("/etc/passwd", u.Username); sh != "" {
		c.Env = append(c.Env, "SHELL="+sh)
	}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				c.Groups = append(c.Groups, uint32(g))
			}
		}
	}
	return c, nil
}

// passwdShell is name's login shell in the passwd file at path ("" when
// the file or the user is not there); an empty shell field is /bin/sh, as
// for login(1).
func passwdShell(path, name string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 7 || f[0] != name {
			continue
		}
		if f[6] == "" {
			return "/bin/sh"
		}
		return f[6]
	}
	return ""
}

func loadToken(o options, getenv func(string) string) (string, error) {
	if o.tokenFD >= 0 {
		f := os.NewFile(uintptr(o.tokenFD), "token")
		if f == nil {
			return "", fmt.Errorf("--token-fd %d is not a valid descriptor", o.tokenFD)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 64<<10))
		if err != nil {
			return "", fmt.Errorf("read token fd: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", errors.New("the token descriptor held no token")
		}
		return tok, nil
	}
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return "", fmt.Errorf("read token file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", errors.New("the token file is empty")
		}
		return tok, nil
	}
	if tok := getenv("AGENTD_TOKEN"); tok != "" {
		return tok, nil
	}
	return "", errors.New("no token: set AGENTD_TOKEN or pass --token-file")
}

// Run is agentd given its arguments (without the program name), its
// environment and where its log goes; it returns when agentd stops.
func Run(args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.version {
		fmt.Fprintln(stderr, agentd.Version)
		return nil
	}
	token, err := loadToken(o, getenv)
	if err != nil {
		return err
	}
	if err := agentd.CheckToken(token); err != nil {
		return err
	}
	if o.tokenFD < 0 {
		// Returns only where re-executing is impossible (Windows).
		if err := reexecClean(reexecArgs(o), token); err != nil {
			return fmt.Errorf("re-execute without the token in the environment: %w", err)
		}
	}
	os.Unsetenv("AGENTD_TOKEN") // commands must not inherit it
	if err := hardenProcess(); err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil))

	cfg := agentd.Config{
		Token:                      token,
		Root:                       o.root,
		MaxSessions:                o.maxSessions,
		RingBytes:                  o.ringBytes,
		PollBytes:                  o.pollBytes,
		SessionTTL:                 o.sessionTTL,
		KillGrace:                  o.killGrace,
		StdinTimeout:               o.stdinTime,
		Cgroup:                     o.cgroup,
		ExecReporting:              o.execReports,
		CgroupParent:               o.cgroupDir,
		SessionMemoryMax:           o.memoryMax,
		SessionPidsMax:             o.pidsMax,
		Subreaper:                  subreaperSupported,
		Spawner:                    !o.noSpawner,
		FetchAllowPrivateRedirects: o.privFetch,
		WriteMaxBytes:              o.writeMax,
		UnpackMaxBytes:             o.unpackMax,
		UnpackMaxFiles:             o.unpackFiles,
		RefuseHardLinks:            o.hardLinks,
		Egress:                     o.egress,
		EgressDNS:                  o.egressDNS,
		Logger:                     logger,
	}
	if o.runAs != "" {
		if cfg.RunAs, err = lookupRunAs(o.runAs); err != nil {
			return err
		}
		if !protectedHardlinks() && !cfg.RefuseHardLinks {
			logger.Warn("fs.protected_hardlinks is off: refusing file reads of files with more than one hard link")
			cfg.RefuseHardLinks = true
		}
	}
	srv, err := agentd.NewServer(cfg)
	if err != nil {
		return err
	}
	defer srv.Close()

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	if o.addrFile != "" {
		if err := writeFileAtomic(o.addrFile, []byte(addr+"\n")); err != nil {
			ln.Close()
			return fmt.Errorf("write addr file: %w", err)
		}
	}
	fmt.Fprintf(stderr, "agentd listening on %s\n", addr)
	if mode, fallback := srv.ProcessTracking(); fallback != nil {
		logger.Warn("no cgroup per session: processes that leave their session's process tree and session id within one scan can escape until a session ends", "tracking", mode, "reason", fallback.Error())
	} else {
		logger.Info("session process tracking", "mode", mode)
	}

	httpSrv := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpSrv.Serve(ln) }()

	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	// Stop accepting and let requests finish while the process groups are
	// killed; killing them also ends the long-polls.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- httpSrv.Shutdown(shutdownCtx) }()
	srv.Close()
	if err := <-shutdownDone; err != nil {
		httpSrv.Close()
	}
	return nil
}

// writeFileAtomic writes data to a temporary file next to path and renames
// it into place, so readers never see a partial address.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
