// Package outbound is the HTTP client for the endpoints users control: the
// engines' /metrics the autoscaler reads, the Prometheus a canary analysis
// queries, the engine a warm-up gate calls. An answer from such an endpoint
// may be made to harm whoever reads it, so the client
//   - follows no redirect: a redirect would send the call on to wherever the
//     answer points, from the caller's network position (the operator's); the
//     caller sees the 3xx as the answer's status;
//   - sends no credential: no Authorization header (the operator's
//     service-account token is its Kubernetes client's alone), no client
//     certificate, no cookie jar;
//   - bounds time: dialing, the TLS handshake and the whole call (Timeout,
//     unless the caller's context ends sooner), and the answer's headers in
//     size. The body is the caller's to bound (an io.LimitReader), and to keep
//     out of status: say what is wrong with it, never what it holds.
package outbound

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"
)

// Timeout bounds a call of Client from dialing to the end of its body.
const Timeout = time.Minute

// dialTimeout bounds the connection and the TLS handshake.
const dialTimeout = 10 * time.Second

// maxHeaderBytes bounds an answer's headers.
const maxHeaderBytes = 64 << 10

// Client is the one client for calls to endpoints users control.
var Client = New(Timeout)

// New is a client as Client with another bound on a whole call (one that
// waits longer for an answer: an engine's first completion).
func New(timeout time.Duration) *http.Client {
	return &http.Client{Transport: transport, Timeout: timeout, CheckRedirect: noRedirect}
}

var transport = &http.Transport{
	// Proxies are the environment's, as for any egress; a loopback address
	// (a warm-up gate's engine) is never sent to one.
	Proxy:                  http.ProxyFromEnvironment,
	DialContext:            (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
	TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
	TLSHandshakeTimeout:    dialTimeout,
	ForceAttemptHTTP2:      true,
	MaxIdleConns:           100,
	MaxIdleConnsPerHost:    2,
	IdleConnTimeout:        90 * time.Second,
	MaxResponseHeaderBytes: maxHeaderBytes,
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
