// Package ociregistry runs a real OCI registry (distribution's registry,
// built from the Go module proxy by hack/tools/build.sh registry) on loopback,
// for the oci model source's tests, benchmarks and the local cluster.
package ociregistry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/aiinference/operator/test/s3test"
	"github.com/aiinference/operator/test/testutil/freeport"
)

// Registry is a running registry.
type Registry struct {
	// Host is HOST:PORT, the registry part of a reference.
	Host string
	cmd  *exec.Cmd
	dir  string
}

// Binary builds (or reuses from the cache) the registry binary.
func Binary() (string, error) { return s3test.Binary("registry", "registry") }

// Options of a registry.
type Options struct {
	// Username and Password, when set, protect the registry with basic auth.
	Username, Password string
	// Addr is where it listens; empty: a free port on 127.0.0.1.
	Addr string
	// Log receives the registry's output; nil: discarded.
	Log io.Writer
}

// Start runs the registry binary over a new storage folder under dir.
func Start(binary, dir string, o Options) (*Registry, error) {
	if o.Addr != "" {
		return start(binary, dir, o, o.Addr)
	}
	// The registry binds its port itself: one found free may be taken
	// before it does, and then it is started again on another.
	var r *Registry
	_, err := freeport.Start(func(port int) error {
		var err error
		r, err = start(binary, dir, o, fmt.Sprintf("127.0.0.1:%d", port))
		return err
	})
	return r, err
}

func start(binary, dir string, o Options, addr string) (*Registry, error) {
	var auth string
	if o.Username != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(o.Password), bcrypt.MinCost)
		if err != nil {
			return nil, err
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, fmt.Appendf(nil, "%s:%s\n", o.Username, hash), 0o600); err != nil {
			return nil, err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: test-registry\n    path: %s\n", htpasswd)
	}
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
%s`, filepath.Join(dir, "storage"), addr, auth)
	path := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "serve", path)
	// No traces: it would post them to localhost:4318 every few seconds.
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	var out io.Writer = io.Discard
	if o.Log != nil {
		out = o.Log
	}
	var tail bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(out, &tail), io.MultiWriter(out, &tail)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &Registry{Host: addr, cmd: cmd, dir: dir}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return r, nil
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("the registry exited at start: %s", tail.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, errors.New("the registry did not answer on " + addr)
		}
	}
}

// Stop ends the registry.
func (r *Registry) Stop() {
	if r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
	}
}
