package loader

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loadspec"
)

// Main is the model-loader command: it parses args, runs the load, writes the
// summary to the termination message path and to the log, and returns the exit
// code (see loadspec).
func Main(args []string, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	opts, err := ParseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0 // the usage is printed; nothing was asked to load
	}
	if err != nil {
		summary := loadspec.Summary{Failure: FailureOf(err)}
		log.Error("Invalid configuration", "error", err.Error())
		writeSummary(log, opts.TerminationMessagePath, summary)
		return ExitCode(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if opts.ProgressAddress != "" {
		opts.Progress = &ProgressBoard{}
		srv := &http.Server{Addr: opts.ProgressAddress, Handler: opts.Progress.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Warn("The progress endpoint stopped", "address", opts.ProgressAddress, "error", err.Error())
			}
		}()
		defer func() { _ = srv.Close() }()
	}
	summary, err := Run(ctx, opts, log)
	if err != nil {
		log.Error("Model load failed", "reason", summary.Failure.Reason, "retryable", summary.Failure.Retryable, "error", err.Error())
	}
	writeSummary(log, opts.TerminationMessagePath, summary)
	return ExitCode(err)
}

// writeSummary logs the summary and writes it to the termination message path.
func writeSummary(log *slog.Logger, path string, s any) {
	data, _ := json.Marshal(s)
	log.Info("Summary", "json", string(data))
	if path == "" {
		return
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		log.Warn("Could not write the termination message", "path", path, "error", err.Error())
	}
}
