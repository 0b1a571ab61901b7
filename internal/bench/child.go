package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// ServeAgentdChild is the body of a child process that serves agentd for
// a benchmark: it prints "URL TOKEN" on out and serves until stdin closes
// (the parent exited) or ctx ends. Running agentd in its own process keeps
// its memory out of the console's RSS figure.
func ServeAgentdChild(ctx context.Context, root string, stdin io.Reader, out io.Writer) error {
	a, err := StartAgentd(root, true)
	if err != nil {
		return err
	}
	defer a.Close()
	if _, err := fmt.Fprintf(out, "%s %s\n", a.URL, a.Token); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(done)
	}()
	select {
	case <-ctx.Done():
	case <-done:
	}
	return nil
}

// SpawnAgentd starts exe with args (a program running ServeAgentdChild)
// and returns the agentd it serves; Close ends the child.
func SpawnAgentd(exe string, args ...string) (*Agentd, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agentd child: %w", err)
	}
	stop := func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return nil, fmt.Errorf("agentd child did not start: %w", err)
	}
	url, token, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		stop()
		return nil, fmt.Errorf("agentd child said %q", line)
	}
	return &Agentd{URL: url, Token: token, Close: stop}, nil
}
