package agentd

import (
	"os"
	"os/exec"
)

// pipes are a non-TTY command's stdout, stderr and optional stdin, as the
// process reads and writes them. The child's ends are kept until it has
// started and then closed: it holds its own copies, and ours would keep
// the pipes open after it exits.
type pipes struct {
	outputs []outputPipe
	stdin   *os.File
	child   []*os.File
}

// newPipes wires cmd's stdout, stderr and (with stdin) stdin to new pipes.
func newPipes(cmd *exec.Cmd, stdin bool) (*pipes, error) {
	p := &pipes{}
	for _, stream := range []uint8{streamStdout, streamStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			p.closeAll()
			return nil, err
		}
		p.outputs = append(p.outputs, outputPipe{f: r, stream: stream})
		p.child = append(p.child, w)
		if stream == streamStdout {
			cmd.Stdout = w
		} else {
			cmd.Stderr = w
		}
	}
	if stdin {
		r, w, err := os.Pipe()
		if err != nil {
			p.closeAll()
			return nil, err
		}
		p.stdin = w
		p.child = append(p.child, r)
		cmd.Stdin = r
	}
	return p, nil
}

// started closes the child's ends once the command runs.
func (p *pipes) started() {
	for _, f := range p.child {
		f.Close()
	}
}

// closeAll closes every end (the command did not start).
func (p *pipes) closeAll() {
	p.started()
	for _, o := range p.outputs {
		o.f.Close()
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
}
