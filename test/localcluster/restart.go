package localcluster

import (
	"context"
	"fmt"
	"time"
)

// RestartAPIServer stops the kube-apiserver (SIGTERM, as an upgrade or a crash
// loop would) and starts it again with the same flags, then waits until it is
// ready. Clients see their watches end and requests fail meanwhile.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	index := -1
	for i, p := range c.procs {
		if p.name == kubeAPIServerBinary {
			index = i
		}
	}
	if index < 0 || c.stopped {
		c.mu.Unlock()
		return fmt.Errorf("no running %s to restart", kubeAPIServerBinary)
	}
	old := c.procs[index]
	c.mu.Unlock()

	old.stop(10 * time.Second)
	p, err := startProcess(old.name, old.cmd.Path, old.cmd.Args[1:], old.env, c.logsDir)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.procs[index] = p
	c.mu.Unlock()

	// The API server answers nothing for a few seconds: wait out the errors.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited after its restart: %v%s", kubeAPIServerBinary, p.exitError(), c.logTails(15))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after its restart: %w", kubeAPIServerBinary, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
