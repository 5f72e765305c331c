package adapteragent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/loadspec"
)

// Main is `model-loader adapters`: it runs the agent and its endpoint until
// it is stopped, and returns the exit code.
func Main(args []string, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	fs := flag.NewFlagSet("adapters", flag.ContinueOnError)
	fs.SetOutput(stderr)
	engineURL := fs.String("engine-url", "http://127.0.0.1:8000", "the engine's URL in the pod")
	setPath := fs.String("set", "/etc/model-loader/"+loadspec.AdaptersFileName, "the adapter set the pod starts with")
	dir := fs.String("adapters-dir", "/models/"+loadspec.AdaptersDir, "the cache volume's adapter folder; every adapter is fetched inside it")
	listen := fs.String("listen", fmt.Sprintf(":%d", loadspec.AdapterAgentPort), "the endpoint's address")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	initial, err := readSet(*setPath)
	if err != nil {
		log.Error("Cannot read the adapter set", "path", *setPath, "error", err.Error())
		return 1
	}
	opts := loader.DefaultOptions()
	fetch := func(ctx context.Context, cfg loadspec.Config) (loadspec.Summary, error) {
		o, err := opts.AdapterOptions(cfg)
		if err != nil {
			return loadspec.Summary{Failure: loader.FailureOf(err)}, err
		}
		return loader.Run(ctx, o, log.With("adapter", cfg.Dest))
	}
	agent, err := New(log, *engineURL, *dir, initial, fetch)
	if err != nil {
		log.Error("Invalid adapter set", "path", *setPath, "error", err.Error())
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := &http.Server{Addr: *listen, Handler: agent.Handler(os.Getenv(loadspec.EnvAdapterToken)), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go agent.Run(ctx)
	log.Info("Adapter agent serving", "address", *listen, "engine", *engineURL, "adapters", len(initial.Adapters))
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("The endpoint stopped", "error", err.Error())
		return 1
	}
	return 0
}

// readSet reads the set the pod starts with; none is an empty set.
func readSet(path string) (loadspec.AdapterSet, error) {
	set := loadspec.AdapterSet{MaxAttempts: 1}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return set, nil
	}
	if err != nil {
		return set, err
	}
	return set, json.Unmarshal(data, &set)
}

// Handler serves the report (GET), a new set (PUT, with the token) and the
// readiness endpoint.
func (a *Agent) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+loadspec.AdaptersPath, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, a.Report())
	})
	mux.HandleFunc("PUT "+loadspec.AdaptersPath, func(w http.ResponseWriter, r *http.Request) {
		if token == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get(loadspec.AdapterTokenHeader)), []byte(token)) != 1 {
			http.Error(w, "a new adapter set needs the object's agent token", http.StatusForbidden)
			return
		}
		var set loadspec.AdapterSet
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, loadspec.MaxAdapterSetBytes)).Decode(&set); err != nil {
			http.Error(w, "reading the adapter set: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := a.Set(set); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, a.Report())
	})
	mux.HandleFunc("GET "+loadspec.AdapterReadyPath, func(w http.ResponseWriter, _ *http.Request) {
		if !a.Ready() {
			http.Error(w, "adapters of the pod's start not tried yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "every adapter of the pod's start was tried")
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
