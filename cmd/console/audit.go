package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
)

// errChainBroken makes `console audit verify` exit non-zero after it has
// printed where the chain breaks.
var errChainBroken = errors.New("audit chain verification failed")

// auditCmd runs `console audit verify --org <slug>`,
// `console audit verify --platform` or `console audit verify --file
// archive.jsonl`: it walks the chosen hash chain and prints "ok: N events
// verified" or "broken at sequence N: <reason>".
func auditCmd(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "verify" {
		return fmt.Errorf("usage: console audit verify (--org <slug> | --platform | --file <archive.jsonl>)")
	}
	fs := flag.NewFlagSet("console audit verify", flag.ContinueOnError)
	fs.SetOutput(stdout)
	slug := fs.String("org", "", "verify the audit log of the organization with this slug")
	platformLog := fs.Bool("platform", false, "verify the platform audit log")
	file := fs.String("file", "", "verify a JSONL file of events on its own: a retention archive or an unfiltered export (- for stdin)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *file != "" {
		if *slug != "" || *platformLog || fs.NArg() > 0 {
			return fmt.Errorf("--file takes no other argument")
		}
		return verifyFile(*file, logger, stdout)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; usage: console audit verify (--org <slug> | --platform)", fs.Arg(0))
	}
	if (*slug == "") == !*platformLog {
		return fmt.Errorf("give exactly one of --org <slug> or --platform")
	}

	cat, err := console.OpenCatalog(ctx, cfg)
	if err != nil {
		return err
	}
	defer store.Close(cat)

	var log *audit.Log
	var orgDB *gorm.DB
	what := "platform audit log"
	if *platformLog {
		log = audit.NewLog(cat, audit.PlatformTable, nil)
	} else {
		box, err := console.LoadMasterKey(cfg)
		if err != nil {
			return err
		}
		svc := orgs.New(orgs.Config{Catalog: cat, Box: box, DataDir: cfg.DataDir, DBPrefix: cfg.OrgDBPrefix,
			ServerDSN: cfg.DatabaseURL, Logger: logger})
		defer svc.Close()
		h, err := svc.Open(ctx, *slug)
		if errors.Is(err, apperr.ErrSuspended) {
			return fmt.Errorf("organization %q is suspended and its database is closed; resume it, verify, then suspend it again", *slug)
		}
		if err != nil {
			return err
		}
		defer h.Release()
		log = audit.NewLog(h.DB, audit.OrgTable, nil)
		orgDB = h.DB
		what = fmt.Sprintf("audit log of organization %q", *slug)
	}

	var res audit.VerifyResult
	if orgDB != nil {
		// An org's chain vouches for its recordings too.
		res, err = recordings.VerifyOrg(ctx, orgDB, log)
	} else {
		res, err = log.Verify(ctx)
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", what, err)
	}
	if !res.OK {
		return reportBroken(res, what, logger, stdout)
	}
	fmt.Fprintf(stdout, "ok: %d events verified\n", res.Checked)
	if res.Checked > 0 {
		logger.Info("audit chain verified", "log", what, "head_seq", res.HeadSeq, "head_hash", res.HeadHash)
	}
	return nil
}

// verifyFile verifies an archive (or export) without any database: the
// events' sequence, links and hashes. It prints where the file starts
// (whose hash the archive before it must end with) and its head.
func verifyFile(path string, logger *slog.Logger, stdout io.Writer) error {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	res, err := audit.VerifyJSONL(r)
	if err != nil {
		return fmt.Errorf("verify %s: %w", path, err)
	}
	if !res.OK {
		return reportBroken(res, path, logger, stdout)
	}
	fmt.Fprintf(stdout, "ok: %d events verified (sequence %d to %d)\nstarts after: %s\nhead hash:    %s\n",
		res.Checked, res.StartSeq, res.HeadSeq, cmp.Or(res.StartPrevHash, "(the start of the chain)"), res.HeadHash)
	return nil
}

// reportBroken prints where what breaks and fails the command.
func reportBroken(res audit.VerifyResult, what string, logger *slog.Logger, stdout io.Writer) error {
	fmt.Fprintf(stdout, "broken at sequence %d: %s\n", res.BrokenAt, res.Reason)
	logger.Error("audit chain broken", "log", what, "broken_at", res.BrokenAt, "checked", res.Checked)
	return errChainBroken
}
