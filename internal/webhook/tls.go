package webhook

import "crypto/tls"

// TLSOptions are the TLS settings of the operator's servers (webhooks and
// metrics): HTTP/2 off, so the HTTP/2 rapid-reset and stream-exhaustion attacks
// (CVE-2023-44487, CVE-2023-39325) cannot reach them; TLS 1.2 at least.
func TLSOptions() []func(*tls.Config) {
	return []func(*tls.Config){func(c *tls.Config) {
		c.NextProtos = []string{"http/1.1"}
		c.MinVersion = tls.VersionTLS12
	}}
}
