package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Serve serves the router on the listener, reading the engines' load
// meanwhile, until ctx ends (the pod's SIGTERM); then it stops as a pod
// should within its terminationGracePeriodSeconds:
//
//  1. For DrainDelay it still takes new requests, while the pod leaves the
//     Services' endpoints (clients already connected, and those that connect
//     before kube-proxy learns it, are not refused); each answer closes its
//     connection (Connection: close), so that clients connect again, to
//     another router. A listener that closes ends the delay: nothing new can come.
//  2. Then it closes the listener, answers what waits for a replica (503,
//     Retry-After: another router holds it when sent again), and lets the
//     requests in flight finish, streams included, for ShutdownTimeout.
//  3. What is still in flight then is cut: those clients see the connection
//     close midway. Serve returns only then, once nothing is left, so that
//     the process does not exit under requests it could still finish.
func (rt *Router) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           rt,
		ReadHeaderTimeout: rt.opts.BodyReadTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	// The engines' load is read while requests are still picked, in the drain too.
	scrape, stopScraping := context.WithCancel(context.WithoutCancel(ctx))
	defer stopScraping()
	go rt.scrapeEngines(scrape)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	var err error
	select {
	case err = <-served:
		// The listener failed before any stop: what is in flight is still let finish.
		served = nil
	case <-ctx.Done():
		rt.draining.Store(true)
		delay := time.NewTimer(rt.opts.DrainDelay)
		select {
		case <-delay.C:
		case err = <-served:
			served = nil
		}
		delay.Stop()
	}
	rt.Stop()
	bound, cancel := context.WithTimeout(context.Background(), rt.opts.ShutdownTimeout)
	defer cancel()
	if srv.Shutdown(bound) != nil {
		_ = srv.Close()
	}
	if served != nil {
		err = <-served
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}
