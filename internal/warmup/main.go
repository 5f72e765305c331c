package warmup

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
	"strconv"
	"syscall"
	"time"
)

// Main is `model-loader warmup`: it serves the readiness endpoint, warms the
// engine up, and then serves until it is stopped. It returns the exit code: 0
// when stopped (warm or not), ExitTimedOut when no completion succeeded within
// --timeout, ExitInvalidArgs for a wrong command line.
func Main(args []string, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, args, stderr, nil)
}

// run is Main with its context, and a function told the readiness endpoint's
// address once it listens (for tests).
func run(ctx context.Context, args []string, stderr io.Writer, listening func(net.Addr)) int {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	opts, err := ParseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fail(log, opts.TerminationMessagePath, "invalid warmup arguments: "+err.Error())
		return ExitInvalidArgs
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		fail(log, opts.TerminationMessagePath, fmt.Sprintf("warm-up gate cannot serve its readiness endpoint: %v", err))
		return ExitTimedOut
	}
	if listening != nil {
		listening(ln.Addr())
	}
	gate := New(opts)
	server := &http.Server{Handler: gate.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = server.Serve(ln) }()
	defer server.Close()

	log.Info("Warming the engine up", "engine", opts.EngineURL, "api", string(opts.API), "model", opts.Model, "timeout", opts.Timeout.String())
	if err := gate.Warm(ctx, log); err != nil {
		if ctx.Err() != nil {
			log.Info("Stopped before the engine was warm")
			return 0
		}
		fail(log, opts.TerminationMessagePath, "warm-up failed: "+err.Error())
		return ExitTimedOut
	}
	// Warm: answer the kubelet's readiness probes and send nothing more.
	<-ctx.Done()
	return 0
}

// fail logs the reason and writes it to the termination message.
func fail(log *slog.Logger, path, msg string) {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage] + "..."
	}
	log.Error("Warm-up gate failed", "error", msg)
	if path == "" {
		return
	}
	if err := os.WriteFile(path, []byte(msg), 0o644); err != nil {
		log.Warn("Could not write the termination message", "path", path, "error", err.Error())
	}
}

// ParseArgs reads the command line.
func ParseArgs(args []string, stderr io.Writer) (Options, error) {
	fset := flag.NewFlagSet("model-loader warmup", flag.ContinueOnError)
	fset.SetOutput(stderr)
	var o Options
	var api string
	fset.StringVar(&api, "api", string(APIOpenAI), "the engine's completion API: openai (POST /v1/completions: vLLM) or tgi (POST /generate: Text Generation Inference)")
	fset.StringVar(&o.EngineURL, "engine-url", "http://127.0.0.1:8000", "the engine's base URL")
	fset.StringVar(&o.Model, "model", "", "the served model name (required for --api openai)")
	fset.StringVar(&o.Prompt, "prompt", DefaultPrompt, "the text of the warm-up completion")
	fset.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "bound on the whole warm-up, after which the gate exits with status "+strconv.Itoa(ExitTimedOut))
	fset.DurationVar(&o.RequestTimeout, "request-timeout", 2*time.Minute, "bound on one completion request")
	fset.DurationVar(&o.Backoff, "backoff", time.Second, "wait after the first failed attempt; it doubles up to --max-backoff")
	fset.DurationVar(&o.MaxBackoff, "max-backoff", 10*time.Second, "longest wait between attempts")
	fset.StringVar(&o.Listen, "listen", ":"+strconv.Itoa(Port), "address of the readiness endpoint (GET "+ReadyPath+")")
	fset.StringVar(&o.TerminationMessagePath, "termination-message-path", "/dev/termination-log", "file that receives the reason of a failed warm-up")
	err := fset.Parse(args)
	o.API = API(api)
	switch {
	case err != nil:
		return o, err
	case fset.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fset.Args())
	case o.API != APIOpenAI && o.API != APITGI:
		return o, fmt.Errorf("--api %q: want %s or %s", api, APIOpenAI, APITGI)
	case o.API == APIOpenAI && o.Model == "":
		return o, errors.New("--model is required for --api openai")
	case o.Prompt == "":
		return o, errors.New("--prompt must not be empty")
	case o.Timeout <= 0 || o.RequestTimeout <= 0 || o.Backoff <= 0 || o.MaxBackoff < o.Backoff:
		return o, errors.New("--timeout, --request-timeout and --backoff must be positive, and --max-backoff at least --backoff")
	}
	return o, nil
}
