//go:build !linux

package agentd

import (
	"errors"
	"log/slog"
)

// startExecMonitor: only Linux has the kernel's process-events connector.
func startExecMonitor(*slog.Logger) (*execMonitor, func(), error) {
	return nil, nil, errors.New("exec reporting needs Linux's process-events connector")
}
