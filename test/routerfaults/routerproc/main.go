// Command routerproc runs the real router (internal/router) as its own
// process, as the router binary does, but over a fixed directory read from a
// world file (test/routerfaults/world: a fake of the cluster) instead of the
// Kubernetes cache, so that test/routerfaults can measure it under a memory
// limit, against fake and simulated engines on loopback.
//
//	routerproc --world=world.json [--listen=127.0.0.1:0] [--metrics-listen=addr] -- [router flags]
//
// Everything after -- is the router binary's command line (router.ParseFlags,
// with the binary's defaults); its --bind-address and --metrics-bind-address
// are not used: requests are served on --listen, whose address is printed on
// stdout as one line once it listens, and /metrics on --metrics-listen when
// given. It runs until SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/test/routerfaults/world"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	ownArgs, routerArgs := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		ownArgs, routerArgs = args[:i], args[i+1:]
	}
	fs := flag.NewFlagSet("routerproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	worldPath := fs.String("world", "", "the world file (JSON or YAML): models, their replicas, hosts and clients")
	listen := fs.String("listen", "127.0.0.1:0", "where requests are served; the address is printed on stdout")
	metricsListen := fs.String("metrics-listen", "", "where /metrics is served; empty: nowhere")
	if err := fs.Parse(ownArgs); err != nil {
		return 2
	}
	if *worldPath == "" || fs.NArg() > 0 {
		_, _ = fmt.Fprintln(stderr, "routerproc: give --world=path, and the router's flags after --")
		return 2
	}
	c, zapOpts, err := router.ParseFlags(routerArgs, stderr)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "routerproc: router flags:", err)
		return 2
	}
	log := zap.New(zap.UseFlagOptions(zapOpts), zap.WriteTo(stderr)).WithName("router")
	router.SetMemoryLimit(log)

	f, err := world.Read(*worldPath)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "routerproc:", err)
		return 2
	}
	dir, err := world.NewDirectory(f)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "routerproc:", err)
		return 2
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rt := router.New(c.Options, dir, world.DenyPolicy{Directory: dir}, router.NewMetrics(reg), log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *metricsListen != "" {
		ml, err := net.Listen("tcp", *metricsListen)
		if err != nil {
			_, _ = fmt.Fprintln(stderr, "routerproc: --metrics-listen:", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		defer func() { _ = srv.Close() }()
		go func() {
			if err := srv.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error(err, "Serving metrics")
			}
		}()
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "routerproc: --listen:", err)
		return 1
	}
	_, _ = fmt.Fprintln(stdout, l.Addr().String())
	log.Info("Routing", "address", l.Addr().String(), "world", *worldPath, "models", len(f.Models))
	if err := rt.Serve(ctx, l); err != nil {
		log.Error(err, "Router stopped")
		return 1
	}
	return 0
}
