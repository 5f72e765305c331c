package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Serve serves the router on the listener until ctx ends, reading the
// engines' load meanwhile; then it answers what waits and stops.
func (rt *Router) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           rt,
		ReadHeaderTimeout: rt.opts.BodyReadTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go rt.scrapeEngines(ctx)
	go func() {
		<-ctx.Done()
		rt.Stop()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}
