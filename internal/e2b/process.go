package e2b

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process/processconnect"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/recordings"
)

// processService is envd's process service over the gateway. A process's
// pid, as the SDK sees it, is the gateway's command id.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

// pollWait bounds one long-poll of a command's output when the client
// asked for no keepalives: a stream is a series of these.
const pollWait = 30 * time.Second

// shells are the programs whose "-c SCRIPT" the gateway can run as the
// command itself: SCRIPT is then what the command policy and the audit log
// see, not a shell's name in front of it.
var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "zsh": true, "ash": true}

// commandLine is the command a StartRequest runs, as one shell line: the
// SDK's commands.run sends /bin/bash -l -c SCRIPT, which runs as SCRIPT
// (agentd runs every command through its shell); anything else is its
// program and arguments, each quoted.
func commandLine(cfg *process.ProcessConfig) string {
	args := cfg.GetArgs()
	if shells[path.Base(cfg.GetCmd())] && len(args) >= 2 && args[len(args)-2] == "-c" {
		onlyFlags := true
		for _, a := range args[:len(args)-2] {
			onlyFlags = onlyFlags && strings.HasPrefix(a, "-")
		}
		if onlyFlags {
			return args[len(args)-1]
		}
	}
	parts := make([]string, 0, len(args)+1)
	parts = append(parts, shellQuote(cfg.GetCmd()))
	for _, a := range args {
		parts = append(parts, shellQuote(a))
	}
	return strings.Join(parts, " ")
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func pidOf(id int64) uint32 {
	if id < 0 || id > math.MaxUint32 {
		return 0
	}
	return uint32(id)
}

// commandOf reads the command a selector names: by pid only (the gateway
// keeps no tags).
func commandOf(sel *process.ProcessSelector) (int64, error) {
	if sel == nil {
		return 0, refuse(connect.CodeInvalidArgument, "Name the process by its pid.")
	}
	if _, ok := sel.GetSelector().(*process.ProcessSelector_Tag); ok {
		return 0, refuse(connect.CodeUnimplemented, "Processes are named by pid here: tags are not kept.")
	}
	if sel.GetPid() == 0 {
		return 0, refuse(connect.CodeInvalidArgument, "Name the process by its pid.")
	}
	return int64(sel.GetPid()), nil
}

// keepalive is the interval the client asked for (Keepalive-Ping-Interval,
// seconds) at which a stream with nothing to say sends a keepalive event.
func keepalive(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 0
	}
	// Capped before it becomes a Duration: a huge count of seconds would
	// overflow to a few nanoseconds, a poll that never waits, and a
	// stream that spins.
	return time.Duration(min(n, int(pollWait/time.Second))) * time.Second
}

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	c := callOf(ctx)
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return refuse(connect.CodeInvalidArgument, "Give the process to start (process.cmd).")
	}
	ex := gateway.ExecRequest{Command: commandLine(cfg), Cwd: cfg.GetCwd(), Env: cfg.GetEnvs(),
		// envd's default for an SDK that does not say: stdin open.
		Stdin: req.Msg.Stdin == nil || req.Msg.GetStdin()}
	if pty := req.Msg.GetPty(); pty != nil {
		ex.TTY, ex.Stdin = true, true
		ex.Rows, ex.Cols = uint16(min(pty.GetSize().GetRows(), agentd.MaxTTYDimension)), uint16(min(pty.GetSize().GetCols(), agentd.MaxTTYDimension))
	}
	if err := ex.Validate(); err != nil {
		return err
	}
	release, err := p.s.holdStream(c)
	if err != nil {
		return err
	}
	defer release()
	out, err := p.s.startHeld(ctx, c, ex)
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pidOf(out.CommandID)}}}); err != nil {
		return err
	}
	return p.s.follow(ctx, c, out, keepalive(req.Header()), send)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	c := callOf(ctx)
	id, err := commandOf(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	release, err := p.s.holdStream(c)
	if err != nil {
		return err
	}
	defer release()
	// Re-attached from the start of its output: what the recording holds
	// is what a reconnecting client is given.
	out, err := p.s.Gateway.Poll(ctx, c.Org, c.Actor, c.SessionID, id, 0, 0)
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pidOf(id)}}}); err != nil {
		return err
	}
	return p.s.follow(ctx, c, out, keepalive(req.Header()), send)
}

// follow streams a command's output from out on, one data event per chunk
// as each poll returns it (sent and flushed before the next poll), then
// its end. With a keepalive interval, a poll that returned nothing is
// answered with a keepalive event.
func (s *Server) follow(ctx context.Context, c call, out gateway.Output, every time.Duration, send func(*process.ProcessEvent) error) error {
	wait := pollWait
	if every > 0 {
		wait = every
	}
	// A revocation ends the stream within gateway.RecheckEvery, whatever
	// its keepalive: each poll waits on a context the recheck ends, as the
	// gateway's own long-polls do, not only until its own wait is over.
	var recheck func(context.Context) (*authz.Actor, error)
	if c.Recheck != nil {
		recheck = func(ctx context.Context) (*authz.Actor, error) { return c.Actor, c.Recheck(ctx) }
	}
	watched, stop := gateway.WatchPrincipal(ctx, recheck)
	defer stop()
	polled := false
	for {
		for _, ch := range out.Chunks {
			if err := send(dataEvent(ch, out.TTY)); err != nil {
				return err
			}
		}
		if out.State != agentd.StateRunning && !out.More {
			return send(endEvent(out))
		}
		if polled && every > 0 && len(out.Chunks) == 0 && !out.More {
			// A whole interval passed with nothing to say.
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		}
		if err := c.recheck(ctx); err != nil {
			return err
		}
		next, err := s.Gateway.Poll(watched, c.Org, c.Actor, c.SessionID, out.CommandID, out.NextCursor, wait.Milliseconds())
		if revoked := gateway.EndedBy(watched); revoked != nil && ctx.Err() == nil {
			return revoked
		}
		if err != nil {
			return err
		}
		next.CommandID = out.CommandID
		out, polled = next, true
	}
}

func dataEvent(ch agentd.Chunk, tty bool) *process.ProcessEvent {
	d := &process.ProcessEvent_DataEvent{}
	switch {
	case tty || ch.Stream == agentd.StreamPTY:
		d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: ch.Data}
	case ch.Stream == agentd.StreamStderr:
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: ch.Data}
	default:
		d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: ch.Data}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

// endEvent is envd's end of a process: exited with its code, or (killed,
// timed out, lost) not exited, with -1 and why.
func endEvent(out gateway.Output) *process.ProcessEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: -1, Status: out.State}
	if out.ExitCode != nil {
		end.ExitCode = int32(*out.ExitCode)
	}
	if out.State == agentd.StateExited {
		end.Exited = true
		end.Status = fmt.Sprintf("exit status %d", end.ExitCode)
	} else {
		msg := "The process ended without exiting: " + out.State + "."
		end.Error = &msg
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
}

func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	c := callOf(ctx)
	cmds, err := p.s.Gateway.Commands(ctx, c.Org, c.Actor, recordings.Filter{SessionID: c.SessionID, State: recordings.StateRunning, Limit: 200})
	if err != nil {
		return nil, err
	}
	resp := &process.ListResponse{}
	for _, cmd := range cmds {
		cwd := cmd.Cwd
		resp.Processes = append(resp.Processes, &process.ProcessInfo{Pid: pidOf(cmd.ID),
			Config: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd.Command}, Cwd: &cwd}})
	}
	return connect.NewResponse(resp), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	if err := p.input(ctx, req.Msg.GetProcess(), req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// input writes one input message to a process, recorded with its typist.
func (p *processService) input(ctx context.Context, sel *process.ProcessSelector, in *process.ProcessInput) error {
	c := callOf(ctx)
	id, err := commandOf(sel)
	if err != nil {
		return err
	}
	data := in.GetStdin()
	if data == nil {
		data = in.GetPty()
	}
	// Empty input still goes to the gateway: it checks the process is
	// this session's, running, and the caller's to type into.
	return p.s.Gateway.Stdin(ctx, c.Org, c.Actor, c.meta, c.SessionID, id, data, false)
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	c := callOf(ctx)
	release, err := p.s.holdStream(c)
	if err != nil {
		return nil, err
	}
	defer release()
	var sel *process.ProcessSelector
	for n := 0; stream.Receive(); n++ {
		if n > 0 {
			if err := c.recheck(ctx); err != nil {
				return nil, err
			}
		}
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *process.StreamInputRequest_Data:
			if sel == nil {
				return nil, refuse(connect.CodeInvalidArgument, "Send the start event, naming the process, before any input.")
			}
			if err := p.input(ctx, sel, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	c := callOf(ctx)
	id, err := commandOf(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.s.Gateway.Stdin(ctx, c.Org, c.Actor, c.meta, c.SessionID, id, nil, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal ends the process (SIGTERM and SIGKILL alike: the gateway's
// kill ends the command and everything it started), audited as
// command.kill.
func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	c := callOf(ctx)
	id, err := commandOf(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL, process.Signal_SIGNAL_SIGTERM:
	default:
		return nil, refuse(connect.CodeInvalidArgument, "Send SIGTERM or SIGKILL.")
	}
	if _, err := p.s.Gateway.Kill(ctx, c.Org, c.Actor, c.meta, c.SessionID, id); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// Update resizes a process's terminal (the only update envd knows).
func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	c := callOf(ctx)
	id, err := commandOf(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		rows, cols := min(size.GetRows(), agentd.MaxTTYDimension), min(size.GetCols(), agentd.MaxTTYDimension)
		if err := p.s.Gateway.Resize(ctx, c.Org, c.Actor, c.meta, c.SessionID, id, uint16(rows), uint16(cols)); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
