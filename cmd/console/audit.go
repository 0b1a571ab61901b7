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
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/anchor"
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
// archive.jsonl [--checkpoint checkpoint.json]`: it walks the chosen hash
// chain and prints "ok: N events verified" or "broken at sequence N:
// <reason>". An org's log is also compared with its signed checkpoints
// (and checkpointed again); a file, with an exported checkpoint.
func auditCmd(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	const usage = "usage: console audit verify (--org <slug> | --platform | --file <events.jsonl> [--checkpoint <checkpoint.json>] | --checkpoint <checkpoint.json>) [--key-fingerprint <sha256>]"
	if len(args) == 0 || args[0] != "verify" {
		return errors.New(usage)
	}
	fs := flag.NewFlagSet("console audit verify", flag.ContinueOnError)
	fs.SetOutput(stdout)
	slug := fs.String("org", "", "verify the audit log of the organization with this slug")
	platformLog := fs.Bool("platform", false, "verify the platform audit log")
	file := fs.String("file", "", "verify a JSONL file of events on its own: a retention archive or an unfiltered export (- for stdin)")
	cpFile := fs.String("checkpoint", "", "an exported audit checkpoint (JSON): check its signature offline, and that the --file reaches and holds it")
	pin := fs.String("key-fingerprint", "", "with --checkpoint: the public_key_sha256 the checkpoint must be signed with (kept from an earlier export)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *pin != "" && *cpFile == "" {
		return fmt.Errorf("--key-fingerprint goes with --checkpoint")
	}
	if *file != "" || *cpFile != "" {
		if *slug != "" || *platformLog || fs.NArg() > 0 {
			return fmt.Errorf("--file and --checkpoint take no --org, --platform or other argument")
		}
		return verifyOffline(*file, *cpFile, *pin, logger, stdout)
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
	var org orgs.Org
	var anchors *anchor.Service
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
		if org, err = svc.Get(ctx, *slug); err != nil {
			return err
		}
		log = audit.NewLog(h.DB, audit.OrgTable, nil)
		orgDB = h.DB
		anchors = &anchor.Service{Catalog: cat, Box: box, Audit: audit.NewLog(cat, audit.PlatformTable, nil)}
		what = fmt.Sprintf("audit log of organization %q", *slug)
	}

	var res audit.VerifyResult
	if orgDB != nil {
		// An org's chain vouches for its recordings too, and must still
		// hold what its checkpoints recorded.
		res, err = recordings.VerifyOrg(ctx, orgDB, log)
		if err == nil {
			res, err = anchors.Verify(ctx, org, log, res)
		}
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
	printAnchor(res, stdout)
	if anchors != nil {
		if tr, err := anchors.Take(ctx, org, log); err != nil {
			logger.Warn("audit checkpoint not taken", "org", org.Slug, "error", err)
		} else if tr.Written {
			fmt.Fprintf(stdout, "checkpoint taken: event %d, hash %s\n"+
				"(a signed record of the verified head, kept in the catalog outside the organization's database: a later verify finds events cut off the end or rewritten against it)\n",
				tr.Checkpoint.Seq, tr.Checkpoint.Hash)
		}
	}
	if res.Checked > 0 {
		logger.Info("audit chain verified", "log", what, "head_seq", res.HeadSeq, "head_hash", res.HeadHash)
	}
	return nil
}

// verifyOffline verifies an archive (or export) and an exported
// checkpoint without any database. The file: the events' sequence, links
// and hashes; it prints where the file starts (whose hash the archive
// before it must end with) and its head. The checkpoint: its signature,
// with its own public key (pinned by fingerprint when given), and that
// the file reaches the checkpointed event and holds it with its hash.
func verifyOffline(path, cpPath, pin string, logger *slog.Logger, stdout io.Writer) error {
	var cp *audit.Anchor
	if cpPath != "" {
		a, err := verifyCheckpointFile(cpPath, pin, stdout)
		if err != nil {
			return err
		}
		cp = &a
	}
	if path == "" {
		return nil
	}
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	var res audit.VerifyResult
	var err error
	if cp != nil {
		res, err = audit.VerifyJSONLAnchored(r, *cp)
	} else {
		res, err = audit.VerifyJSONL(r)
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", path, err)
	}
	if res.Filtered {
		fmt.Fprintln(stdout, res.Reason)
		return errFilteredExport
	}
	if !res.OK {
		return reportBroken(res, path, logger, stdout)
	}
	fmt.Fprintf(stdout, "ok: %d events verified (sequence %d to %d)\nstarts after: %s\nhead hash:    %s\n",
		res.Checked, res.StartSeq, res.HeadSeq, cmp.Or(res.StartPrevHash, "(the start of the chain)"), res.HeadHash)
	printAnchor(res, stdout)
	return nil
}

// verifyCheckpointFile checks an exported checkpoint's signature.
func verifyCheckpointFile(path, pin string, stdout io.Writer) (audit.Anchor, error) {
	f, err := os.Open(path)
	if err != nil {
		return audit.Anchor{}, err
	}
	defer f.Close()
	exp, err := anchor.ReadExport(f)
	if err != nil {
		return audit.Anchor{}, fmt.Errorf("%s: %w", path, err)
	}
	a, err := exp.Verify(pin)
	if err != nil {
		fmt.Fprintf(stdout, "checkpoint %s: %v\n", path, err)
		return audit.Anchor{}, errCheckpointInvalid
	}
	pinned := "not pinned: compare it with the one you kept"
	if pin != "" {
		pinned = "pinned"
	}
	fmt.Fprintf(stdout, "checkpoint signature ok: organization %q, event %d, hash %s, taken %s\nsigned by key %s (%s)\n",
		exp.Org, exp.Seq, exp.Hash, exp.TakenAt, exp.PublicKeySHA256, pinned)
	return a, nil
}

// errFilteredExport makes the command exit non-zero after it said the
// file is a filtered export: nothing was verified, nothing is broken.
var errFilteredExport = errors.New("a filtered export cannot be verified")

// errCheckpointInvalid makes the command exit non-zero after it printed
// why a checkpoint's signature does not verify.
var errCheckpointInvalid = errors.New("audit checkpoint signature verification failed")

// printAnchor says which checkpoint the log or file was found to hold.
func printAnchor(res audit.VerifyResult, stdout io.Writer) {
	if res.Anchor == nil {
		return
	}
	a := res.Anchor.Anchor
	fmt.Fprintf(stdout, "holds the checkpoint of %s: event %d, hash %s\n", a.TakenAt.UTC().Format(time.RFC3339), a.Seq, a.Hash)
}

// reportBroken prints where what breaks and fails the command.
func reportBroken(res audit.VerifyResult, what string, logger *slog.Logger, stdout io.Writer) error {
	if res.BrokenAt == 0 {
		// The chain links; its checkpoints do not hold.
		fmt.Fprintf(stdout, "verification failed: %s\n", res.Reason)
		logger.Error("audit checkpoints do not verify", "log", what, "checked", res.Checked)
		return errChainBroken
	}
	fmt.Fprintf(stdout, "broken at sequence %d: %s\n", res.BrokenAt, res.Reason)
	logger.Error("audit chain broken", "log", what, "broken_at", res.BrokenAt, "checked", res.Checked)
	return errChainBroken
}
