package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/gatehouse/gatehouse/internal/config"
)

func auditCmd(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	return fmt.Errorf("audit: not available yet")
}
